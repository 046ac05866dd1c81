//! Misbehaving agents: each fault is recorded with its category on its trajectory, the rest
//! of the run goes on, and every finished result is written.

use std::time::Duration;

use super::support::{Behavior, MisbehavingServer, OK_BODY, closed_port};
use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_fault_category_is_recorded_and_the_run_goes_on() {
    let servers = [
        (
            "http-5xx",
            MisbehavingServer::respond(500, "upstream exploded").await,
        ),
        (
            "http-4xx",
            MisbehavingServer::respond(404, "{\"detail\":\"no\"}").await,
        ),
        (
            "invalid-json",
            MisbehavingServer::respond(200, "<html>oops</html>").await,
        ),
        (
            "protocol",
            MisbehavingServer::respond(200, "{\"answer\":\"hi\"}").await,
        ),
        (
            "slow-drip",
            MisbehavingServer::start(Behavior::SlowDrip {
                interval: Duration::from_millis(100),
            })
            .await,
        ),
        ("reset", MisbehavingServer::start(Behavior::Reset).await),
        (
            "truncated",
            MisbehavingServer::start(Behavior::Truncated).await,
        ),
        (
            "huge",
            MisbehavingServer::start(Behavior::Huge {
                bytes: 20 * 1024 * 1024,
                content_length: false,
            })
            .await,
        ),
        ("healthy", MisbehavingServer::respond(200, OK_BODY).await),
    ];
    let mut suite = String::new();
    for (name, server) in &servers {
        suite.push_str(&format!(
            "agent \"{name}\" protocol=\"connexity\" url=\"{}\" {{ timeout \"500ms\" }}\n",
            server.url()
        ));
    }
    suite.push_str(&format!(
        "agent \"connect\" protocol=\"connexity\" url=\"http://{}/agent/respond\"\n",
        closed_port().await
    ));
    let agents: Vec<&str> = servers.iter().map(|(n, _)| *n).chain(["connect"]).collect();
    suite.push_str(&format!(
        "scenario \"hello\" {{\n    agents {}\n    user \"hi\"\n    user \"again\"\n    \
         expect no-error\n}}\n",
        agents
            .iter()
            .map(|a| format!("\"{a}\""))
            .collect::<Vec<_>>()
            .join(" ")
    ));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("faults.kdl"), suite).unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path())
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));

    let t = read_parquet(&out.join("trajectories.parquet"));
    let rows: Vec<(String, Option<String>, String)> = strings(&t, "agent")
        .into_iter()
        .zip(strings(&t, "fault_category"))
        .zip(strings(&t, "status"))
        .map(|((a, f), s)| (a.unwrap(), f, s.unwrap()))
        .collect();
    let fault_of = |agent: &str| {
        let row = rows.iter().find(|r| r.0 == agent).unwrap();
        (row.1.clone(), row.2.clone())
    };
    for (agent, category) in [
        ("http-5xx", "http_5xx"),
        ("http-4xx", "http_4xx"),
        ("invalid-json", "invalid_json"),
        ("protocol", "protocol"),
        ("slow-drip", "timeout"),
        ("reset", "transport"),
        ("truncated", "transport"),
        ("huge", "too_large"),
        ("connect", "connect"),
    ] {
        assert_eq!(
            fault_of(agent),
            (Some(category.to_string()), "error".to_string()),
            "{agent}"
        );
    }
    assert_eq!(fault_of("healthy"), (None, "passed".to_string()));

    // The faulted turn is kept with its message; the healthy agent took both turns.
    let turns = read_parquet(&out.join("turns.parquet"));
    let messages = strings(&turns, "fault_message");
    assert!(messages.iter().flatten().any(|m| m.contains("500")));
    let healthy_turns = strings(&turns, "agent")
        .iter()
        .filter(|a| a.as_deref() == Some("healthy"))
        .count();
    assert_eq!(healthy_turns, 2);
    // The 20 MB body was not read: the server could not push anywhere near all of it.
    let huge = &servers.iter().find(|(n, _)| *n == "huge").unwrap().1;
    let written = huge
        .stats
        .body_bytes_written
        .load(std::sync::atomic::Ordering::SeqCst);
    assert!(written < 16 * 1024 * 1024, "wrote {written} bytes");
}

/// `no-error` on a trajectory stopped by a fault has its answer: it failed, with the fault.
/// It is not one of the "checks that did not run" (a setup fault included: no turn at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_error_fails_on_the_fault_that_stopped_the_trajectory() {
    let down = closed_port().await;
    let suite = format!(
        "agent \"down\" protocol=\"connexity\" url=\"http://{down}/agent/respond\"\n\
         agent \"fixie-down\" protocol=\"fixie\" url=\"http://{down}\"\n\
         scenario \"chat\" {{\n    agent \"down\"\n    user \"hi\"\n    expect no-error\n    \
         user \"again\"\n    expect no-error\n    criteria {{ no-error; turns max=5 }}\n}}\n\
         scenario \"calls\" {{\n    agent \"fixie-down\"\n    call \"add\" \"1, 2\"\n    \
         criteria {{ no-error }}\n}}\n"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("down.kdl"), suite).unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path())
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));

    let c = read_parquet(&out.join("criteria.parquet"));
    let rows: Vec<(String, String, String, String)> = strings(&c, "scenario")
        .into_iter()
        .zip(strings(&c, "criterion"))
        .zip(strings(&c, "status"))
        .zip(strings(&c, "detail"))
        .map(|(((sc, cr), st), d)| (sc.unwrap(), cr.unwrap(), st.unwrap(), d.unwrap()))
        .collect();
    let find = |scenario: &str, criterion: &str| {
        rows.iter()
            .find(|r| r.0 == scenario && r.1 == criterion)
            .unwrap_or_else(|| panic!("no {criterion} row for {scenario}: {rows:?}"))
            .clone()
    };
    // Both the `expect` of the turn the fault stopped and the trajectory's check fail on
    // it; the `expect` of the turn never taken did not run.
    let no_errors: Vec<&(String, String, String, String)> = rows
        .iter()
        .filter(|r| r.0 == "chat" && r.1 == "no-error")
        .collect();
    assert_eq!(no_errors.len(), 3, "{rows:?}");
    let verdicts: Vec<&str> = no_errors.iter().map(|r| r.2.as_str()).collect();
    assert_eq!(
        verdicts.iter().filter(|v| **v == "failed").count(),
        2,
        "{no_errors:?}"
    );
    assert_eq!(
        verdicts.iter().filter(|v| **v == "skipped").count(),
        1,
        "{no_errors:?}"
    );
    for chat in no_errors.iter().filter(|r| r.2 == "failed") {
        assert!(chat.3.contains("turn 0: connect fault"), "{chat:?}");
    }
    let calls = find("calls", "no-error");
    assert_eq!(calls.2, "failed", "{calls:?}");
    assert!(calls.3.starts_with("setup fault"), "{calls:?}");
    // What the fault does not answer still did not run.
    assert_eq!(find("chat", "turns max=5").2, "skipped");
    assert!(
        stdout(&o).contains("2 checks did not run"),
        "{}",
        stdout(&o)
    );
}

/// A Connexity reply that stops before the agent answered (it ends with a `tool` message,
/// as at a reference agent's tool-round cap, or with tool calls left without results) is a
/// protocol fault on its turn: `no-error` and `not-contains` do not pass it, and the tool
/// calls it made are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_stops_before_answering_is_a_protocol_fault() {
    let call = serde_json::json!({"id": "call_a", "type": "function",
        "function": {"name": "check_service_area", "arguments": "{\"zone\":\"V4T0A7\"}"}});
    let ends_with_tool = serde_json::json!({"messages": [
        {"role": "assistant", "content": "Let me check.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_a", "content": "{\"serviced\":true}"},
    ]});
    let ends_with_calls = serde_json::json!({"messages": [
        {"role": "assistant", "content": "Let me check.", "tool_calls": [call]},
    ]});
    // Nothing at all: an answer without text or a tool call.
    let empty = serde_json::json!({"messages": [
        {"role": "assistant", "content": null, "tool_calls": null},
    ]});
    let tool_end = MisbehavingServer::respond(200, ends_with_tool.to_string()).await;
    let calls_end = MisbehavingServer::respond(200, ends_with_calls.to_string()).await;
    let empty_end = MisbehavingServer::respond(200, empty.to_string()).await;
    let healthy = MisbehavingServer::respond(200, OK_BODY).await;
    let suite = format!(
        "agent \"tool-end\" protocol=\"connexity\" url=\"{}\"\n\
         agent \"calls-end\" protocol=\"connexity\" url=\"{}\"\n\
         agent \"empty\" protocol=\"connexity\" url=\"{}\"\n\
         agent \"healthy\" protocol=\"connexity\" url=\"{}\"\n\
         scenario \"area\" {{\n    agents \"tool-end\" \"calls-end\" \"empty\" \"healthy\"\n    \
         user \"hi\"\n    expect no-error\n    \
         criteria {{ no-error; reply not-contains=\"sorry\" }}\n}}\n",
        tool_end.url(),
        calls_end.url(),
        empty_end.url(),
        healthy.url()
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cap.kdl"), suite).unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path())
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));

    let t = read_parquet(&out.join("trajectories.parquet"));
    let rows: Vec<(String, Option<String>, String)> = strings(&t, "agent")
        .into_iter()
        .zip(strings(&t, "fault_category"))
        .zip(strings(&t, "status"))
        .map(|((a, f), s)| (a.unwrap(), f, s.unwrap()))
        .collect();
    for agent in ["tool-end", "calls-end", "empty"] {
        let row = rows.iter().find(|r| r.0 == agent).unwrap();
        assert_eq!(
            (row.1.as_deref(), row.2.as_str()),
            (Some("protocol"), "error"),
            "{agent}: {rows:?}"
        );
    }
    let healthy_row = rows.iter().find(|r| r.0 == "healthy").unwrap();
    assert_eq!(healthy_row.2, "passed", "{rows:?}");
    let turns = read_parquet(&out.join("turns.parquet"));
    let messages: Vec<String> = strings(&turns, "fault_message")
        .into_iter()
        .flatten()
        .collect();
    assert!(
        messages
            .iter()
            .any(|m| m.contains("ends with a `tool` message")),
        "{messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("tool calls that have no results")),
        "{messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("has no text and no tool call")),
        "{messages:?}"
    );
    // What the agent wrote before its unanswered tool calls is not its reply.
    let replies: Vec<(Option<String>, Option<String>)> = strings(&turns, "agent")
        .into_iter()
        .zip(strings(&turns, "reply"))
        .collect();
    assert!(
        replies.contains(&(Some("calls-end".into()), None)),
        "{replies:?}"
    );
    // The call the agent made before stopping is recorded.
    let calls = read_parquet(&out.join("tool_calls.parquet"));
    let called: Vec<(Option<String>, Option<String>)> = strings(&calls, "agent")
        .into_iter()
        .zip(strings(&calls, "name"))
        .collect();
    assert!(
        called.contains(&(Some("tool-end".into()), Some("check_service_area".into()))),
        "{called:?}"
    );
    let c = read_parquet(&out.join("criteria.parquet"));
    let verdicts: Vec<(Option<String>, Option<String>, Option<String>)> = strings(&c, "agent")
        .into_iter()
        .zip(strings(&c, "criterion"))
        .zip(strings(&c, "status"))
        .map(|((a, cr), st)| (a, cr, st))
        .collect();
    for (agent, criterion, status) in &verdicts {
        if agent.as_deref() != Some("healthy") {
            assert_ne!(
                status.as_deref(),
                Some("passed"),
                "{criterion:?}: {verdicts:?}"
            );
        }
    }
}

/// An AgentScope agent never speaks first: `first-turn "agent"` against one is a suite
/// error, reported before anything runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_cannot_speak_first_asked_to_is_a_suite_error() {
    for (protocol, builtin) in [
        ("agentscope", "weather"),
        ("multiagent", "support"),
        ("anthropic", "concierge\" model=\"c-1"),
    ] {
        an_agent_asked_to_speak_first_is_a_suite_error(protocol, builtin).await;
    }
    // An OpenAI-compatible model opens only when a system prompt asks it to: without one
    // it would be sent no message at all.
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("first.kdl");
    let text = "agent \"a\" protocol=\"openai\" builtin=\"clerk\" model=\"clerk-1\"\n\
                scenario \"greets\" {\n    agent \"a\"\n    first-turn \"agent\"\n    \
                expect no-error\n}\n";
    std::fs::write(&suite, text).unwrap();
    let o = trellis().arg("check").arg(&suite).output().await.unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        crate::flat(&stderr(&o)).contains("has no `system-prompt`"),
        "{}",
        stderr(&o)
    );
    std::fs::write(
        &suite,
        text.replace(
            "model=\"clerk-1\"",
            "model=\"clerk-1\" system-prompt=\"Greet the caller first.\"",
        ),
    )
    .unwrap();
    let o = trellis()
        .arg("run")
        .arg(&suite)
        .arg("--out")
        .arg(dir.path().join("out"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
}

async fn an_agent_asked_to_speak_first_is_a_suite_error(protocol: &str, builtin: &str) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("first.kdl"),
        format!(
            "agent \"a\" protocol=\"{protocol}\" builtin=\"{builtin}\"\n\
             scenario \"greets\" {{\n    agent \"a\"\n    first-turn \"agent\"\n    \
             user \"Hi\"\n    criteria {{ turns max=3 }}\n}}\n"
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path())
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{protocol}: {}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("cannot speak"), "{err}");
    assert!(err.contains("first.kdl:2:"), "{err}");
    assert!(!out.exists(), "nothing runs");
}

/// A Fixie agent whose handshake never completes holds up its own trajectories only: the
/// other agents' trajectories run (and are recorded) while it waits out its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_handshake_does_not_hold_up_the_other_agents() {
    let stuck = MisbehavingServer::start(Behavior::SlowDrip {
        interval: Duration::from_millis(200),
    })
    .await;
    let healthy = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("mixed.kdl"),
        format!(
            "agent \"stuck\" protocol=\"fixie\" url=\"http://{}\" timeout=\"3s\"\n\
             agent \"healthy\" protocol=\"connexity\" url=\"{}\"\n\
             scenario \"calls\" {{\n    agent \"stuck\"\n    call \"add\" \"1, 2\"\n}}\n\
             scenario \"chat\" {{\n    agent \"healthy\"\n    user \"hi\"\n    \
             expect no-error\n}}\n",
            stuck.addr,
            healthy.url()
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path())
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let journal = crate::journal_text(&out);
    let trajectories: Vec<serde_json::Value> = journal
        .lines()
        .filter(|l| l.starts_with("{\"trajectory\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let order: Vec<(&str, &str)> = trajectories
        .iter()
        .map(|t| {
            (
                t["trajectory"]["scenario"].as_str().unwrap(),
                t["trajectory"]["status"].as_str().unwrap(),
            )
        })
        .collect();
    // Before, every agent was set up before any trajectory started: `chat` waited for the
    // handshake's 3s timeout and was recorded after `calls`.
    assert_eq!(order, [("chat", "passed"), ("calls", "error")], "{journal}");
}

/// An HTTP agent that echoes the `Authorization` header it got: in its reply, or, when the
/// user says `fail`, in a 500 body.
pub(crate) async fn echoing_agent() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 8192];
                let (head, body) = loop {
                    let Ok(n) = stream.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    request.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&request).into_owned();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let length: usize = head
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse().ok())?
                            })
                            .unwrap_or(0);
                        if body.len() >= length {
                            break (head.to_owned(), body.to_owned());
                        }
                    }
                };
                let auth = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("authorization")
                            .then(|| v.trim().to_owned())
                    })
                    .unwrap_or_default();
                let (status, body) = if body.contains("fail") {
                    (
                        "500 Internal Server Error",
                        format!("refused request with Authorization: {auth}"),
                    )
                } else {
                    let reply = serde_json::json!({
                        "messages": [{"role": "assistant", "content": format!("you sent {auth}")}]
                    });
                    ("200 OK", reply.to_string())
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    (addr, task)
}

/// Every string in a Parquet column, lists included.
fn column_strings(series: &Series, out: &mut Vec<String>) {
    match series.dtype() {
        DataType::String => out.extend(series.str().unwrap().iter().flatten().map(str::to_owned)),
        DataType::List(_) => column_strings(&series.list().unwrap().get_inner(), out),
        _ => {}
    }
}

/// The text of a file a run wrote: a Parquet table's strings, every other file's bytes.
fn texts_of(path: &std::path::Path) -> Vec<String> {
    if path.extension().is_some_and(|e| e == "parquet") {
        let df = read_parquet(path);
        let mut texts = Vec::new();
        for column in df.columns() {
            column_strings(column.as_materialized_series(), &mut texts);
        }
        texts
    } else {
        vec![String::from_utf8_lossy(&std::fs::read(path).unwrap()).into_owned()]
    }
}

/// A secret sent in an agent header, echoed by agents in a reply, a 500 body, on stderr
/// (as it is, and percent-encoded as a URL's query carries it) and in a crash, appears in
/// no file the run writes nor on the console.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_secret_an_agent_echoes_is_redacted_everywhere() {
    // A base64 key's `/`, `+` and `=` are what percent-encoding changes.
    const SECRET: &str = "s3cr3t-token/9f8e+7d6c==";
    const ENCODED: &str = "s3cr3t-token%2F9f8e%2B7d6c%3D%3D";
    let (addr, _server) = echoing_agent().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("agent.py"),
        r#"
import json, os, sys, urllib.parse
task = json.loads(sys.stdin.read())["task_description"]
print("debug: token is " + os.environ["ECHO_TOKEN"], file=sys.stderr)
token = os.environ["ECHO_TOKEN"]
print("debug: GET /sso?token=" + urllib.parse.quote(token, safe=""), file=sys.stderr)
print("debug: lower " + urllib.parse.quote(token, safe="").lower(), file=sys.stderr)
if "fail" in task:
    sys.exit(3)
print(json.dumps({"action": "final_answer", "summary": "token " + os.environ["ECHO_TOKEN"]}))
"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("secret.kdl"),
        format!(
            r#"agent "web" protocol="connexity" url="http://{addr}/agent/respond" retries=0 {{
    header "Authorization" "Bearer {{{{ env.ECHO_TOKEN }}}}"
}}
agent "proc" protocol="multiagent" command="python3 -u agent.py" cwd="."
scenario "echoes" {{
    agents "web" "proc"
    user "hello"
    expect reply equals="nothing"
}}
scenario "fails" {{
    agents "web" "proc"
    user "fail"
}}
"#
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("secret.kdl"))
        .arg("--out")
        .arg(&out)
        .env("ECHO_TOKEN", SECRET)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let console = format!("{}{}", stdout(&o), stderr(&o));
    assert!(!console.contains(SECRET), "console: {console}");
    assert!(!console.contains(ENCODED), "console: {console}");

    // The secret did reach the records, redacted, in every way it was echoed.
    let journal = crate::journal_text(&out);
    for echoed in [
        "you sent Bearer [redacted]",
        "Authorization: Bearer [redacted]",
        "token [redacted]",
        "debug: token is [redacted]",
        "debug: GET /sso?token=[redacted]",
    ] {
        assert!(journal.contains(echoed), "{echoed} not in the journal");
    }

    let mut files = 0;
    for entry in std::fs::read_dir(&out).unwrap() {
        let path = entry.unwrap().path();
        files += 1;
        let texts = texts_of(&path);
        for spelling in [SECRET, ENCODED, &ENCODED.to_lowercase()] {
            assert!(
                !texts.iter().any(|t| t.contains(spelling)),
                "{} holds the secret as {spelling}",
                path.display()
            );
        }
    }
    assert!(files >= 5, "journal, tables, HTML, JUnit: {files} files");
}

/// An error body is quoted only up to its first 200 characters: a secret that straddles
/// that cut shows none of its characters either (the start of it is as much a secret).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_secret_cut_by_a_quoted_error_body_shows_no_part_of_it() {
    const SECRET: &str = "s3cr3t-token-9f8e7d6c";
    // The quote ends 5 characters into the secret.
    let body = format!("{}{SECRET} and more text after it", "E".repeat(195));
    let server = MisbehavingServer::respond(500, body).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("cut.kdl"),
        format!(
            r#"agent "web" protocol="connexity" url="{}" retries=0 {{
    header "Authorization" "Bearer {{{{ env.ECHO_TOKEN }}}}"
}}
scenario "fails" {{
    agent "web"
    user "hello"
    expect no-error
}}
"#,
            server.url()
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("cut.kdl"))
        .arg("--out")
        .arg(&out)
        .env("ECHO_TOKEN", SECRET)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let start = &SECRET[..5];
    let console = format!("{}{}", stdout(&o), stderr(&o));
    assert!(console.contains("[redacted]…"), "console: {console}");
    assert!(
        !console.contains(&format!("{start}…")),
        "console: {console}"
    );
    let files = ["report.html", "junit.xml", "summary.json"].map(|file| {
        let text = std::fs::read_to_string(out.join(file)).unwrap();
        (file, text)
    });
    for (file, text) in [("journal", crate::journal_text(&out))]
        .into_iter()
        .chain(files)
    {
        assert!(
            !text.contains(&format!("{start}…")),
            "{file} shows `{start}…`"
        );
    }
    let df = read_parquet(&out.join("turns.parquet"));
    let mut texts = Vec::new();
    for column in df.columns() {
        column_strings(column.as_materialized_series(), &mut texts);
    }
    assert!(texts.iter().any(|t| t.contains("[redacted]…")), "{texts:?}");
    assert!(!texts.iter().any(|t| t.contains(&format!("{start}…"))));
}

/// A server that closes a kept-alive connection when a request arrives on it (as llama.cpp
/// may, just as a request goes out; or an agent that read it and crashed) fails no turn of
/// an agent with `retry-after-send #true`: the lost request goes again on a fresh one. An
/// agent without it gets a `transport` fault on that turn, the request sent once. (Its
/// answers take 20 ms: the second turn goes on a fresh connection, the first's not yet idle
/// past the pool's grace; the third reuses the first's, and is lost.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_closing_reused_connections_fails_no_turn_when_resending_is_allowed() {
    let server = MisbehavingServer::start(Behavior::CloseReused {
        body: OK_BODY.to_owned(),
        delay: std::time::Duration::from_millis(20),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suite = |resend: bool| {
        format!(
            "agent \"a\" protocol=\"connexity\" url=\"{}\" {{ retry-after-send #{resend} }}\n\
             scenario \"talk\" {{\n    user \"one\"\n    user \"two\"\n    \
             user \"three\"\n}}\n",
            server.url()
        )
    };
    let run = |name: &'static str, resend: bool| {
        let dir = dir.path().to_owned();
        let text = suite(resend);
        async move {
            let file = dir.join(format!("{name}.kdl"));
            std::fs::write(&file, text).unwrap();
            trellis()
                .arg("run")
                .arg(&file)
                .arg("--out")
                .arg(dir.join(name))
                .output()
                .await
                .unwrap()
        }
    };
    let o = run("resend", true).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(server.requests(), 3);

    let o = run("once", false).await;
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let turns = read_parquet(&dir.path().join("once/turns.parquet"));
    let faults = strings(&turns, "fault_category");
    // The lost turn is the third (the second, should the machine have paused the run past
    // the grace): the turns before it answered, it was not sent again, and none after it.
    let (lost, answered) = faults.split_last().unwrap();
    assert_eq!(lost.as_deref(), Some("transport"), "{turns}");
    assert!(
        !answered.is_empty() && answered.iter().all(Option::is_none),
        "{turns}"
    );
    assert_eq!(server.requests(), 3 + answered.len(), "{turns}");
}

/// Eight one-turn trajectories, all started at once at `--jobs 8`.
const EIGHT_AT_ONCE: &str = "repeat 8\n    user \"one\"";

/// An agent whose accept queue overflows (a backlog of 1, nothing accepted for 300 ms) gets
/// every turn through, and the run's end says how many connection attempts the queue
/// dropped: on the console, in the journal's `run_finished`, in `summary.json` and in the
/// report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overflowing_accept_queue_is_named_at_the_end() {
    let server = MisbehavingServer::overflowing(Duration::from_millis(300)).await;
    let (o, dir) = run_passing(&server, EIGHT_AT_ONCE, 8).await;
    assert_eq!(server.requests(), 8);
    let out = dir.path().join("out");
    let address = server.addr.to_string();
    let line = stdout(&o)
        .lines()
        .find(|l| l.contains("BACKLOG"))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no BACKLOG line: {}", stdout(&o)));
    assert!(
        line.contains(&format!("{address} dropped")) && line.contains("--jobs"),
        "{line}"
    );

    // Two connections fit the queue; the other six wait out at least one attempt each.
    let finished = run_finished(&out);
    let redone = finished["connections_redone"][&address]
        .as_u64()
        .expect("connections_redone by address");
    assert!(redone >= 6, "{finished}");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(
        summary["stats"]["aggregates"]["connections_redone"][&address].as_u64(),
        Some(redone)
    );
    let report = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(
        report.contains(&format!("{address} dropped {redone} connection attempt")),
        "the report names the agent"
    );
}

/// An agent with room for every connection gets no such notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_notice_when_the_accept_queue_keeps_up() {
    let server = MisbehavingServer::respond(200, OK_BODY).await;
    let (o, dir) = run_passing(&server, EIGHT_AT_ONCE, 8).await;
    assert_eq!(server.requests(), 8);
    assert!(!stdout(&o).contains("BACKLOG"), "{}", stdout(&o));
    let finished = run_finished(&dir.path().join("out"));
    assert!(finished.get("connections_redone").is_none(), "{finished}");
}

/// A one-scenario suite against `server` (`steps`: the scenario's body), run at `--jobs
/// jobs`; every trajectory must pass. The results are in `out` under the returned directory.
async fn run_passing(
    server: &MisbehavingServer,
    steps: &str,
    jobs: u32,
) -> (std::process::Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("suite.kdl"),
        format!(
            "agent \"a\" protocol=\"connexity\" url=\"{}\"\n\
             scenario \"talk\" {{\n    {steps}\n}}\n",
            server.url()
        ),
    )
    .unwrap();
    let o = trellis()
        .arg("run")
        .arg(dir.path())
        .arg("--out")
        .arg(dir.path().join("out"))
        .args(["--jobs", &jobs.to_string()])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    (o, dir)
}

/// The journal's `run_finished` entry.
fn run_finished(out: &std::path::Path) -> serde_json::Value {
    journal_text(out)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|mut e| e.get_mut("run_finished").map(serde_json::Value::take))
        .expect("run_finished")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_terminal_escapes_are_printed_as_text() {
    // Clears the screen, sets the window title, moves up a line and overwrites it.
    let server =
        MisbehavingServer::respond(500, "\x1b[2J\x1b]0;pwned\x07\x1b[1A\rPASS \u{202e}txt").await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("esc.kdl");
    std::fs::write(
        &suite,
        format!(
            "agent \"esc\" protocol=\"connexity\" url=\"{}\"\n\
             scenario \"s\" {{\n    user \"hi\"\n    expect reply contains=\"x\"\n}}\n",
            server.url()
        ),
    )
    .unwrap();
    let o = trellis()
        .arg("run")
        .arg(&suite)
        .arg("--out")
        .arg(dir.path().join("out"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("http_5xx fault"), "{out}");
    assert!(
        out.contains(r"\u{1b}[2J\u{1b}]0;pwned\u{7}\u{1b}[1A PASS \u{202e}txt"),
        "{out}"
    );
    for raw in ['\x1b', '\x07', '\r', '\u{202e}'] {
        assert!(!out.contains(raw), "{raw:?} reached the terminal: {out:?}");
    }
}

/// A turn that waited out a rate limit took the run that long: `turns.ended_ms`, the JUnit
/// suite's wall time and the case's time all count the wait, which `latency_ms` (the
/// answer's) does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_wait_is_in_the_turns_wall_time_and_the_junit_suites() {
    let server = MisbehavingServer::start(Behavior::RateLimited {
        times: 1,
        retry_after: Some("1".into()),
        body: "slow down".into(),
    })
    .await;
    let (_, dir) = run_passing(&server, "user \"hi\"\n    expect no-error", 4).await;
    let out = dir.path().join("out");
    let turns = read_parquet(&out.join("turns.parquet"));
    let column = |name: &str| turns.column(name).unwrap().f64().unwrap().get(0).unwrap();
    let (started, ended, latency) = (
        column("started_ms"),
        column("ended_ms"),
        column("latency_ms"),
    );
    assert!(latency < 500.0, "the wait is in no latency: {latency}");
    assert!(ended - started >= 1000.0, "{started}..{ended}");
    let junit = std::fs::read_to_string(out.join("junit.xml")).unwrap();
    let seconds = |tag: &str| -> f64 {
        let at = junit.find(tag).unwrap_or_else(|| panic!("{tag}: {junit}"));
        let time = &junit[at..];
        let time = &time[time.find("time=\"").unwrap() + 6..];
        time[..time.find('"').unwrap()].parse().unwrap()
    };
    for tag in ["<testsuites", "<testsuite ", "<testcase"] {
        assert!(seconds(tag) >= 1.0, "{tag} time under the wait: {junit}");
    }
}

/// A stop while a call waits out a long rate limit ends the run at once, not after the
/// grace period: nothing of that call is in flight, and its wait would outlast the grace.
/// Its trajectory is left unfinished (for `--resume`), and the other agent's finished one is
/// kept. A wait that ends within the grace is waited out, and its trajectory finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_drops_a_call_whose_rate_limit_wait_outlasts_the_grace_period() {
    let (err, agents) = stopped_during_a_rate_limit_wait("60").await;
    assert!(!err.contains("are abandoned"), "sat out the grace: {err}");
    assert_eq!(agents, ["healthy"]);
    let (err, agents) = stopped_during_a_rate_limit_wait("1").await;
    assert!(!err.contains("are abandoned"), "{err}");
    assert_eq!(agents, ["gated", "healthy"], "a 1 s wait is waited out");
}

/// SIGTERM to a run while its `gated` agent waits out a 429 asking for `retry_after`
/// seconds; the run's stderr and the agents of the trajectories it recorded.
async fn stopped_during_a_rate_limit_wait(retry_after: &str) -> (String, Vec<String>) {
    let gated = MisbehavingServer::start(Behavior::RateLimited {
        times: 1,
        retry_after: Some(retry_after.into()),
        body: "slow down".into(),
    })
    .await;
    let healthy = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("limited.kdl"),
        format!(
            "agent \"gated\" protocol=\"connexity\" url=\"{}\"\n\
             agent \"healthy\" protocol=\"connexity\" url=\"{}\"\n\
             scenario \"hello\" {{\n    agents \"gated\" \"healthy\"\n    user \"hi\"\n}}\n",
            gated.url(),
            healthy.url()
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let child = trellis()
        .arg("run")
        .arg(dir.path())
        .arg("--out")
        .arg(&out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while gated.requests() == 0 || healthy.requests() == 0 {
        assert!(std::time::Instant::now() < deadline, "no call was made");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The healthy agent's trajectory is recorded as it answers.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = i32::try_from(child.id().unwrap()).unwrap();
    let signalled = std::time::Instant::now();
    // SAFETY: kill(2) on a child process id this test spawned and has not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let o = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("trellis did not exit after SIGTERM")
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(143), "{err}");
    assert!(signalled.elapsed() < Duration::from_secs(5), "{err}");
    let t = read_parquet(&out.join("trajectories.parquet"));
    let mut agents: Vec<String> = strings(&t, "agent").into_iter().flatten().collect();
    agents.sort();
    (err, agents)
}

/// A run that a fault stopped before a fork reached none of its branches: the report's
/// tree does not link the branches to that run's transcript, which has no place for them.
/// Every in-page link of the report leads somewhere.
#[tokio::test]
async fn the_report_links_no_node_to_a_transcript_that_never_reached_it() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("down.kdl");
    std::fs::write(
        &suite,
        format!(
            r#"agent "down" protocol="connexity" url="http://{}/agent/respond"
agent "demo" protocol="connexity" builtin="booking"
scenario "forks" {{
    agents "down" "demo"
    user "Hi"
    branch "a" {{
        user "A"
    }}
    branch "b" {{
        user "B"
    }}
    expect no-error
}}
"#,
            closed_port().await
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .args(["run", "--quiet", "--out"])
        .arg(&out)
        .arg(&suite)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    let quoted_after = |marker: &str| -> Vec<String> {
        html.split(marker)
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .map(str::to_owned)
            .collect()
    };
    let ids: std::collections::HashSet<String> = quoted_after(" id=\"").into_iter().collect();
    let links = quoted_after("href=\"#");
    assert!(!links.is_empty());
    let dangling: Vec<&String> = links
        .iter()
        .filter(|l| !l.is_empty() && !ids.contains(*l))
        .collect();
    assert!(dangling.is_empty(), "links to nothing: {dangling:?}");
}

/// A process agent's key reaches it through the environment it inherits, where no header
/// reads it: `secret-env` declares it a secret, redacted wherever the agent echoes it (its
/// stderr, its reply) in every file the run writes and on the console.
#[tokio::test]
async fn a_declared_secret_env_a_process_echoes_is_redacted_everywhere() {
    const SECRET: &str = "proc-key-7c1d2e3f4a5b";
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("agent.py"),
        r#"
import json, os, sys
json.loads(sys.stdin.read())
print("debug: key is " + os.environ["PROC_KEY"], file=sys.stderr)
sys.exit(3)
"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("secret.kdl"),
        r#"agent "proc" protocol="multiagent" command="python3 -u agent.py" cwd="." {
    secret-env "PROC_KEY" "UNSET_KEY_NAME"
}
scenario "echoes" {
    user "hello"
    expect no-error
}
"#,
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("secret.kdl"))
        .arg("--out")
        .arg(&out)
        .env("PROC_KEY", SECRET)
        .env_remove("UNSET_KEY_NAME")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let console = format!("{}{}", stdout(&o), stderr(&o));
    assert!(!console.contains(SECRET), "console: {console}");
    assert!(
        crate::journal_text(&out).contains("debug: key is [redacted]"),
        "the echo was recorded, redacted"
    );
    for entry in std::fs::read_dir(&out).unwrap() {
        let path = entry.unwrap().path();
        let texts = texts_of(&path);
        assert!(
            !texts.iter().any(|t| t.contains(SECRET)),
            "{} holds the secret",
            path.display()
        );
    }

    std::fs::write(
        dir.path().join("bad.kdl"),
        "agent \"proc\" protocol=\"multiagent\" command=\"python3 agent.py\" {\n    secret-env \"sk-live-123\"\n}\n",
    )
    .unwrap();
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("bad.kdl"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert!(
        said.contains("invalid environment variable name `sk-live-123`")
            && said.contains("bad.kdl:2:16"),
        "{said}"
    );
}

/// After Fixie `call` steps (a turn each, as `user` steps are) a failed check is placed at
/// the one line that wrote it for that turn, not at every place it is written.
#[tokio::test]
async fn a_check_after_fixie_calls_is_placed_at_its_own_line() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    std::fs::write(
        &suite,
        "agent \"n\" protocol=\"fixie\" builtin=\"numbers\"\n\
         scenario \"loc\" {\n    \
             agent \"n\"\n    \
             call \"echo\" \"hi\"\n    \
             expect no-error\n    \
             call \"fail\" \"x\"\n    \
             expect no-error\n\
         }\n",
    )
    .unwrap();
    let o = trellis()
        .args(["run", "--out"])
        .arg(dir.path().join("out"))
        .arg(&suite)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let said = stdout(&o);
    let line = said
        .lines()
        .find(|l| l.contains("✗ turn 1: no-error"))
        .unwrap_or_else(|| panic!("no failed check in {said}"));
    assert!(line.ends_with("/suite.kdl:7:12)"), "{line}");
    assert!(!line.contains(":5:12"), "{line}");
}
