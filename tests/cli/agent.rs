//! `trellis agent support` as a real process: JSON lines on stdin/stdout (long-lived and one
//! process per call), the engine's MultiAgentEval client running the action loop against it
//! (what `transport="process"` does), and a socket server stopped by a signal.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Child;
use trellis_agents as builtin;
use trellis_engine::protocol::TurnInput;
use trellis_engine::protocol::multiagent::session::{MultiAgentClient, MultiAgentOptions};
use trellis_engine::sandbox::{Policy, SandboxSpec, ToolSpec};
use trellis_engine::transport::http::RetryPolicy;
use trellis_engine::transport::line::{LineLimits, ProcessMode};

use crate::support::ctx;
use crate::{stderr, stdout, trellis};

fn reply(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

#[tokio::test]
async fn stdio_answers_a_line_per_request_until_stdin_ends() {
    let mut child = trellis()
        .args(["agent", "support", "--stdio"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let task = "Refund $120 for order A-1001";
    stdin
        .write_all(
            format!(
                "{}\n",
                json!({"task_description": task, "turn": 1, "conversation_history": []})
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let first = reply(&lines.next_line().await.unwrap().unwrap());
    assert_eq!(first["name"], "trellis-support");
    assert_eq!(first["action"], "call_tool");
    assert_eq!(first["tool_name"], "get_order");
    // The same process answers the next request, which carries the history.
    let next = json!({
        "task_description": "GOVERNANCE ERROR: Amount 120 exceeds limit of 50.0. Please adjust your action.",
        "turn": 3,
        "conversation_history": [
            {"role": "user", "content": task},
            {"role": "agent", "content": {"action": "call_tool", "tool_name": "apply_refund", "tool_params": {"order_id": "A-1001", "amount": 120}}},
            {"role": "environment", "content": {"status": "policy_violation", "violation": "Amount 120 exceeds limit of 50.0"}},
        ],
    });
    stdin
        .write_all(format!("{next}\n").as_bytes())
        .await
        .unwrap();
    let second = reply(&lines.next_line().await.unwrap().unwrap());
    assert_eq!(
        second["tool_params"],
        json!({"order_id": "A-1001", "amount": 50})
    );
    drop(stdin);
    assert_eq!(lines.next_line().await.unwrap(), None);
    let output = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(output.status.success(), "{:?}", output.status);
    let log = stderr(&output);
    assert_eq!(
        log.matches("[support] answered call_tool").count(),
        2,
        "{log}"
    );
}

#[tokio::test]
async fn per_call_reads_stdin_to_its_end_and_answers_once() {
    let mut child = trellis()
        .args(["agent", "support", "--per-call"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // As the real harness writes it: no trailing newline, then stdin closed.
    stdin
        .write_all(br#"{"task_description":"How do I cancel an order?"}"#)
        .await
        .unwrap();
    drop(stdin);
    let output = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(output.status.success(), "{:?}", output.status);
    let out = stdout(&output);
    assert_eq!(out.lines().count(), 1, "{out}");
    let answer = reply(out.trim());
    assert_eq!(answer["action"], "provide_instructions");
    assert!(
        answer["instructions"]
            .as_str()
            .is_some_and(|i| i.contains("Cancel")),
        "{answer}"
    );
}

#[tokio::test]
async fn the_client_runs_the_loop_against_trellis_as_the_agent_process() {
    // What `transport="process"` runs: the command the engine builds for this executable.
    let launcher =
        builtin::BuiltinLauncher::new().with_executable(env!("CARGO_BIN_EXE_trellis").into());
    let sandbox = SandboxSpec {
        tools: HashMap::from([
            (
                "get_order".to_owned(),
                ToolSpec::fixed(json!({"order_id": "A-1001", "total": 120})),
            ),
            (
                "apply_refund".to_owned(),
                ToolSpec {
                    policies: vec![Policy::max_limit(50.0)],
                    ..ToolSpec::fixed(json!({"status": "success"}))
                },
            ),
        ]),
        ..SandboxSpec::default()
    };
    for mode in [ProcessMode::LongLived, ProcessMode::PerCall] {
        let process = match mode {
            ProcessMode::LongLived => builtin::ProcessMode::LongLived,
            ProcessMode::PerCall => builtin::ProcessMode::PerCall,
        };
        let command = launcher.agent_command("support", process).unwrap();
        assert!(
            command.ends_with(match mode {
                ProcessMode::LongLived => "agent support --stdio",
                ProcessMode::PerCall => "agent support --per-call",
            }),
            "{command}"
        );
        let options = MultiAgentOptions {
            process_mode: mode,
            sandbox: Arc::new(sandbox.clone()),
            ..MultiAgentOptions::default()
        };
        let limits = LineLimits {
            timeout: Duration::from_secs(10),
            max_line: 1024 * 1024,
        };
        let client = MultiAgentClient::process(
            &command,
            Vec::new(),
            None,
            limits,
            RetryPolicy::default(),
            options,
        );
        let mut session = client.session();
        let turn = session
            .take_turn(TurnInput::User("Refund $120 for order A-1001"), &ctx(0))
            .await;
        assert!(turn.fault.is_none(), "{mode:?}: {:?}", turn.fault);
        let calls: Vec<&str> = turn.tool_calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            calls,
            ["get_order", "apply_refund", "apply_refund"],
            "{mode:?}"
        );
        assert_eq!(session.violation_count(), 1);
        assert!(
            turn.reply
                .as_deref()
                .is_some_and(|r| r.starts_with("Refunded $50 for order A-1001.")),
            "{mode:?}: {:?}",
            turn.reply
        );
        assert_eq!(turn.model.as_deref(), Some("trellis-support"));
        // The agent's stderr is the turn's log.
        let log = turn
            .messages
            .iter()
            .find(|m| m.role == "log")
            .and_then(|m| m.content.clone())
            .unwrap_or_default();
        assert!(
            log.contains("[support] answered final_answer"),
            "{mode:?}: {log}"
        );
        client.close().await;
    }
}

fn send(child: &Child, signal: i32) {
    let pid = i32::try_from(child.id().unwrap()).unwrap();
    // SAFETY: kill(2) on a child process id this test spawned and has not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
}

/// Starts `trellis agent support --listen ADDRESS` and reads the address it prints.
async fn listening(address: &str) -> (Child, String) {
    let mut child = trellis()
        .args(["agent", "support", "--listen", address])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut bound = String::new();
    tokio::time::timeout(Duration::from_secs(10), out.read_line(&mut bound))
        .await
        .unwrap()
        .unwrap();
    (child, bound.trim().to_owned())
}

async fn stopped(mut child: Child, signal: i32) {
    send(&child, signal);
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
    let mut log = String::new();
    if let Some(mut err) = child.stderr.take() {
        err.read_to_string(&mut log).await.unwrap();
    }
    assert!(log.contains("[support] stopped"), "{log}");
}

#[tokio::test]
async fn listen_prints_the_bound_address_and_stops_on_a_signal() {
    let (child, bound) = listening("tcp:127.0.0.1:0").await;
    let host_port = bound
        .strip_prefix("tcp:127.0.0.1:")
        .unwrap_or_else(|| panic!("{bound}"));
    assert_ne!(host_port, "0");
    let stream = tokio::net::TcpStream::connect(bound.trim_start_matches("tcp:"))
        .await
        .unwrap();
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    for task in ["Check order A-1001", "Run diagnostics"] {
        write
            .write_all(format!("{}\n", json!({"task_description": task})).as_bytes())
            .await
            .unwrap();
        let answer = reply(&lines.next_line().await.unwrap().unwrap());
        assert_eq!(answer["action"], "call_multiple_tools", "{answer}");
    }
    stopped(child, libc::SIGTERM).await;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("support.sock");
    let (child, bound) = listening(&format!("unix://{}", path.display())).await;
    assert_eq!(bound, format!("unix:{}", path.display()));
    let stream = tokio::net::UnixStream::connect(&path).await.unwrap();
    let (read, mut write) = stream.into_split();
    write
        .write_all(b"{\"task_description\":\"Sing\"}\n")
        .await
        .unwrap();
    let answer = reply(
        &BufReader::new(read)
            .lines()
            .next_line()
            .await
            .unwrap()
            .unwrap(),
    );
    assert_eq!(answer["summary"], "Unsupported task: Sing");
    stopped(child, libc::SIGINT).await;
    assert!(!path.exists(), "the socket file is left behind");
}

#[tokio::test]
async fn line_modes_are_refused_for_http_only_builtins() {
    let output = trellis()
        .args(["agent", "booking", "--stdio"])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("speaks only HTTP"),
        "{}",
        stderr(&output)
    );
}

#[tokio::test]
async fn the_example_suite_passes_over_every_transport() {
    // `transport="process"` runs this very binary as the agent (one process per call).
    let out = tempfile::tempdir().unwrap();
    let output = trellis()
        .args(["run", "suites/multiagent.kdl", "--out"])
        .arg(out.path())
        .output()
        .await
        .unwrap();
    let console = stdout(&output);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{console}{}",
        stderr(&output)
    );
    assert!(
        console.contains(", 0 failed, 0 errors, 0 skipped"),
        "{console}"
    );
    let trajectories = crate::read_parquet(&out.path().join("trajectories.parquet"));
    assert_eq!(trajectories.height(), 28);
    // The agent's branch action forked `complaint` on every transport.
    let rows: Vec<(Option<String>, Option<String>, Option<String>)> =
        crate::strings(&trajectories, "scenario")
            .into_iter()
            .zip(crate::strings(&trajectories, "trajectory"))
            .zip(crate::strings(&trajectories, "agent"))
            .map(|((scenario, trajectory), agent)| (scenario, trajectory, agent))
            .collect();
    for agent in [
        "support-http",
        "support-process",
        "support-tcp",
        "support-unix",
    ] {
        for option in ["main~refund", "main~replacement"] {
            let row = (
                Some("complaint".to_owned()),
                Some(option.to_owned()),
                Some(agent.to_owned()),
            );
            assert!(rows.contains(&row), "{option} on {agent}: {rows:?}");
        }
    }
}
