//! The builtin MultiAgentEval agent `support`, served the way `transport` asks
//! ([`builtin::BuiltinLauncher::endpoint_for`]: HTTP, a TCP port, a Unix socket) and driven through the real
//! client and sandbox: tools, a policy breach and the agent's self-correction, several tools
//! at once in both shapes, a human's approval and rejection, instructions, `processing`, and
//! both request forms and feedback wordings. (As a process of the trellis executable it is
//! tested by the CLI tests, which have the binary.)

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use trellis_agents::{
    self as builtin, BuiltinEndpoint, BuiltinError, BuiltinTransport, ServedBuiltin, SocketKind,
};
use trellis_engine::protocol::TurnInput;
use trellis_engine::protocol::multiagent::session::{
    MultiAgentClient, MultiAgentOptions, MultiAgentSession,
};
use trellis_engine::protocol::multiagent::wire::{Action, RequestForm, decode_reply};
use trellis_engine::record::FaultCategory;
use trellis_engine::sandbox::{
    FeedbackWording, MatchedOutput, Policy, SandboxSpec, StateChange, ToolAnswer, ToolSpec,
};
use trellis_engine::transport::http::{CallLimits, HttpTransport, RetryPolicy};
use trellis_engine::transport::line::LineLimits;

use crate::support::ctx;

const LINE_LIMITS: LineLimits = LineLimits {
    timeout: Duration::from_secs(10),
    max_line: 1024 * 1024,
};

/// The shop's tools: an order lookup, a refund capped at 50 that records itself in the
/// state, a credit limit change, and the two status lookups.
fn shop() -> SandboxSpec {
    let tools = [
        (
            "get_order",
            ToolSpec::fixed(json!({"order_id": "A-1001", "total": 120, "status": "delivered"})),
        ),
        (
            "apply_refund",
            ToolSpec {
                required: Vec::new(),
                policies: vec![Policy::max_limit(50.0)],
                state_changes: vec![StateChange {
                    path: "orders.A-1001.refund".into(),
                    value: json!("issued"),
                }],
                // Saying what was refunded lets an agent without history tell it.
                answer: ToolAnswer::Matched(vec![
                    MatchedOutput {
                        when: json!({"amount": 50})
                            .as_object()
                            .cloned()
                            .unwrap_or_default(),
                        ..MatchedOutput::any(json!({"status": "success", "refunded": 50}))
                    },
                    MatchedOutput::any(json!({"status": "success"})),
                ]),
            },
        ),
        (
            "set_credit_limit",
            ToolSpec {
                answer: ToolAnswer::Matched(vec![MatchedOutput {
                    when: json!({"customer_id": "C-7"})
                        .as_object()
                        .cloned()
                        .unwrap_or_default(),
                    output: json!({"status": "success", "credit_limit": 900}),
                    state_changes: vec![StateChange {
                        path: "customers.C-7.credit_limit".into(),
                        value: json!(900),
                    }],
                }]),
                ..ToolSpec::default()
            },
        ),
        (
            "get_shipping_status",
            ToolSpec::fixed(json!({"status": "in_transit"})),
        ),
        (
            "get_payment_status",
            ToolSpec::fixed(json!({"status": "captured"})),
        ),
    ];
    SandboxSpec {
        tools: tools
            .into_iter()
            .map(|(name, tool)| (name.to_owned(), tool))
            .collect::<HashMap<_, _>>(),
        initial_state: json!({"orders": {"A-1001": {"refund": "none"}}}),
        ..SandboxSpec::default()
    }
}

fn options(form: RequestForm, feedback: FeedbackWording) -> MultiAgentOptions {
    MultiAgentOptions {
        request_form: form,
        feedback,
        sandbox: Arc::new(shop()),
        ..MultiAgentOptions::default()
    }
}

/// The agent served over `transport`, and a client for it.
async fn support(
    transport: BuiltinTransport,
    options: MultiAgentOptions,
) -> (ServedBuiltin, MultiAgentClient) {
    let served = builtin::BuiltinLauncher::new()
        .endpoint_for("support", transport, builtin::ProcessMode::LongLived, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = match &served.endpoint {
        BuiltinEndpoint::Url(url) => MultiAgentClient::http(
            url,
            Vec::new(),
            CallLimits::default(),
            RetryPolicy::default(),
            HttpTransport::new(),
            options,
        ),
        BuiltinEndpoint::Socket(address) => {
            MultiAgentClient::socket(address, LINE_LIMITS, RetryPolicy::default(), options)
        }
        BuiltinEndpoint::Command(command) => panic!("not served as a process here: {command}"),
    }
    .unwrap_or_else(|e| panic!("{e}"));
    (served, client)
}

async fn user(session: &mut MultiAgentSession, text: &str) -> trellis_engine::protocol::Turn {
    session.take_turn(TurnInput::User(text), &ctx(0)).await
}

fn tool_names(turn: &trellis_engine::protocol::Turn) -> Vec<&str> {
    turn.tool_calls.iter().map(|c| c.name.as_str()).collect()
}

const TRANSPORTS: [BuiltinTransport; 3] = [
    BuiltinTransport::Http,
    BuiltinTransport::Tcp,
    BuiltinTransport::Unix,
];

#[tokio::test]
async fn a_refund_breaches_the_policy_and_self_corrects_over_every_transport() {
    // Every transport, with the spec's request and wording, and the newer harness's.
    let generations = [
        (RequestForm::Full, FeedbackWording::Spec),
        (RequestForm::TaskOnly, FeedbackWording::Spec),
        (RequestForm::Full, FeedbackWording::Harness),
    ];
    for transport in TRANSPORTS {
        for (form, feedback) in generations {
            let what = format!("{transport:?} {form:?} {feedback:?}");
            let (_served, client) = support(transport, options(form, feedback)).await;
            let mut session = client.session();
            let turn = user(&mut session, "Refund $120 for order A-1001").await;
            assert!(turn.fault.is_none(), "{what}: {:?}", turn.fault);
            assert_eq!(
                tool_names(&turn),
                ["get_order", "apply_refund", "apply_refund"],
                "{what}"
            );
            let amounts: Vec<Value> = turn
                .tool_calls
                .iter()
                .skip(1)
                .map(|c| {
                    serde_json::from_str::<Value>(&c.arguments).unwrap_or_default()["amount"]
                        .clone()
                })
                .collect();
            assert_eq!(amounts, [json!(120), json!(50)], "{what}");
            assert_eq!(session.violation_count(), 1, "{what}");
            let reply = turn.reply.as_deref().unwrap_or_default();
            assert!(reply.starts_with("Refunded $50"), "{what}: {reply}");
            assert_eq!(turn.model.as_deref(), Some("trellis-support"), "{what}");
            assert_eq!(
                session.sandbox().state_at("orders.A-1001.refund"),
                Some(&json!("issued")),
                "{what}"
            );
            client.close().await;
        }
    }
}

#[tokio::test]
async fn the_history_tells_the_agent_what_was_asked() {
    // With the full request the summary knows the $120 asked; task-only it cannot.
    let (_served, client) = support(
        BuiltinTransport::Tcp,
        options(RequestForm::Full, FeedbackWording::Spec),
    )
    .await;
    let mut session = client.session();
    let turn = user(&mut session, "Refund $120 for order A-1001").await;
    assert_eq!(
        turn.reply.as_deref(),
        Some(
            "Refunded $50 for order A-1001. The $120 requested exceeds the refund limit; the \
             remaining $70 needs a manual review."
        )
    );
}

#[tokio::test]
async fn a_human_approves_or_rejects_a_credit_limit_change() {
    for transport in TRANSPORTS {
        let (_served, client) =
            support(transport, options(RequestForm::Full, FeedbackWording::Spec)).await;
        let mut session = client.session();
        let pause = user(
            &mut session,
            "Raise the credit limit of customer C-7 to 900",
        )
        .await;
        assert!(pause.fault.is_none(), "{:?}", pause.fault);
        assert!(
            pause
                .reply
                .as_deref()
                .is_some_and(|r| r.contains("needs a human's approval")),
            "{:?}",
            pause.reply
        );
        assert!(session.paused().is_some());
        let mut rejected = session.clone();
        let approve = TurnInput::Human {
            approve: true,
            message: Some("go ahead"),
        };
        let approved = session.take_turn(approve, &ctx(1)).await;
        assert!(approved.fault.is_none(), "{:?}", approved.fault);
        assert_eq!(tool_names(&approved), ["set_credit_limit"]);
        assert_eq!(
            approved.reply.as_deref(),
            Some("Raised the credit limit of customer C-7 to $900 as approved.")
        );
        assert_eq!(
            session.sandbox().state_at("customers.C-7.credit_limit"),
            Some(&json!(900))
        );
        let reject = TurnInput::Human {
            approve: false,
            message: Some("too risky"),
        };
        let turn = rejected.take_turn(reject, &ctx(1)).await;
        assert!(turn.tool_calls.is_empty());
        assert_eq!(
            turn.reply.as_deref(),
            Some(
                "Left the credit limit of customer C-7 unchanged: the change to $900 was \
                 rejected (too risky)."
            )
        );
        assert_eq!(
            rejected.sandbox().state_at("customers.C-7.credit_limit"),
            None
        );
    }
}

#[tokio::test]
async fn several_tools_instructions_processing_and_errors() {
    let (_served, client) = support(
        BuiltinTransport::Unix,
        options(RequestForm::Full, FeedbackWording::Spec),
    )
    .await;
    let mut session = client.session();
    // The newer shape, with parameters.
    let turn = user(&mut session, "Check order A-1001").await;
    assert_eq!(
        tool_names(&turn),
        ["get_shipping_status", "get_payment_status"]
    );
    assert_eq!(turn.tool_calls[0].arguments, r#"{"order_id":"A-1001"}"#);
    assert_eq!(
        turn.reply.as_deref(),
        Some("Order A-1001: get_shipping_status: in_transit; get_payment_status: captured.")
    );
    // The spec's shape: undeclared tools get the harness default.
    let turn = user(&mut session, "Run diagnostics").await;
    assert_eq!(
        tool_names(&turn),
        ["check_payment_gateway", "check_shipping_api"]
    );
    assert_eq!(turn.tool_calls[1].arguments, "{}");
    assert_eq!(
        turn.reply.as_deref(),
        Some("check_payment_gateway: success; check_shipping_api: success.")
    );
    let turn = user(&mut session, "How do I return an item?").await;
    assert!(
        turn.reply
            .as_deref()
            .is_some_and(|r| r.contains("prepaid label")),
        "{:?}",
        turn.reply
    );
    // `processing` once, then the answer on the resend.
    let turn = user(&mut session, "Export the order history of customer C-7").await;
    assert_eq!(turn.exchanges.len(), 2);
    assert_eq!(
        turn.reply.as_deref(),
        Some("Exported the order history of customer C-7 to orders.csv.")
    );
    let turn = user(&mut session, "Sing me a song").await;
    let fault = turn.fault.unwrap_or_else(|| panic!("no fault"));
    assert_eq!(fault.category, FaultCategory::AgentError);
    assert!(
        fault.message.contains("Unsupported task: Sing me a song"),
        "{}",
        fault.message
    );
}

#[tokio::test]
async fn one_socket_connection_answers_a_branch_and_its_continuation() {
    let server = builtin::serve_socket("support", SocketKind::Tcp)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let address = server.address().strip_prefix("tcp:").unwrap_or_default();
    let stream = tokio::net::TcpStream::connect(address)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let task = "Resolve the complaint on order A-1001";
    write
        .write_all(format!("{}\n", json!({"task_description": task})).as_bytes())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut line = String::new();
    read.read_line(&mut line).await.unwrap_or_default();
    let branch = decode_reply(line.as_bytes()).unwrap_or_else(|f| panic!("{f:?}"));
    let Action::Branch {
        reason, options, ..
    } = &branch.action
    else {
        panic!("{:?}", branch.action);
    };
    assert!(
        reason
            .as_deref()
            .is_some_and(|r| r.contains("refund or a replacement"))
    );
    assert_eq!(options, &["refund", "replacement"]);
    // The continuation, as the harness sends it, on the same connection.
    let continuation = json!({
        "task_description": "Continue on branch 2 of 2: replacement.",
        "turn": 2,
        "conversation_history": [
            {"role": "user", "content": task},
            {"role": "agent", "content": branch.raw},
            {"role": "environment", "content": {"branch": {"index": 2, "count": 2, "option": "replacement"}}},
        ],
    });
    write
        .write_all(format!("{continuation}\n").as_bytes())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    line.clear();
    read.read_line(&mut line).await.unwrap_or_default();
    let next = decode_reply(line.as_bytes()).unwrap_or_else(|f| panic!("{f:?}"));
    let Action::CallTool(call) = next.action else {
        panic!("{:?}", next.action);
    };
    assert_eq!(call.name, "ship_replacement");
    assert_eq!(Value::Object(call.params), json!({"order_id": "A-1001"}));
    // The client closing is the end of the conversation, not an error.
    drop(write);
    line.clear();
    assert_eq!(read.read_line(&mut line).await.unwrap_or(1), 0);
    server.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test]
async fn unix_sockets_are_removed_and_http_only_builtins_are_refused() {
    let server = builtin::serve_socket("support", SocketKind::Unix)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let path = std::path::PathBuf::from(server.address().strip_prefix("unix:").unwrap_or_default());
    assert!(path.exists());
    drop(server);
    assert!(!path.exists(), "{} is left behind", path.display());
    assert!(!path.parent().is_some_and(|dir| dir.exists()));
    assert!(matches!(
        builtin::serve_socket("booking", SocketKind::Tcp).await,
        Err(BuiltinError::NotALineAgent { .. })
    ));
    assert!(matches!(
        builtin::serve_socket("nobody", SocketKind::Unix).await,
        Err(BuiltinError::Unknown { .. })
    ));
    // The test binary is not trellis: a process endpoint says so instead of guessing.
    assert!(matches!(
        builtin::BuiltinLauncher::new()
            .endpoint_for(
                "support",
                BuiltinTransport::Process,
                builtin::ProcessMode::PerCall,
                None
            )
            .await,
        Err(BuiltinError::NoExecutable { .. })
    ));
}
