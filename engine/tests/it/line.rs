//! The line transport against real processes and sockets.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UnixListener};
use trellis_engine::record::{Fault, FaultCategory};
use trellis_engine::transport::line::{
    LineEndpoint, LineLimits, LineReply, LineTransport, ProcessMode, ProcessSpec,
};

const LIMITS: LineLimits = LineLimits {
    timeout: Duration::from_secs(10),
    max_line: 1024 * 1024,
};

fn process(command: &str, mode: ProcessMode) -> LineTransport {
    LineTransport::new(
        LineEndpoint::Process(ProcessSpec {
            command: command.to_owned(),
            env: vec![("GREETING".into(), "hello".into())],
            cwd: None,
            mode,
        }),
        LIMITS,
        true,
    )
}

async fn call(transport: &LineTransport, request: &str) -> Result<LineReply, Fault> {
    transport
        .call(request.as_bytes(), Duration::from_secs(10))
        .await
}

fn text(reply: &LineReply) -> &str {
    std::str::from_utf8(&reply.line).unwrap()
}

/// An answer line decoded as JSON, refused as `invalid_json`.
fn json(line: &[u8]) -> Result<serde_json::Value, Fault> {
    serde_json::from_slice(line).map_err(|e| Fault::new(FaultCategory::InvalidJson, e.to_string()))
}

#[track_caller]
fn fault(result: Result<LineReply, Fault>, category: FaultCategory) -> String {
    match result {
        Err(fault) => {
            assert_eq!(fault.category, category, "{fault:?}");
            fault.message
        }
        Ok(reply) => panic!("expected a {category:?} fault, got {reply:?}"),
    }
}

#[tokio::test]
async fn a_long_lived_process_answers_line_by_line_and_its_stderr_is_kept() {
    let agent = process(
        r#"while read -r line; do echo "got $line" >&2; echo "{\"pid\":$$,\"greeting\":\"$GREETING\"}"; done"#,
        ProcessMode::LongLived,
    );
    let first = call(&agent, r#"{"turn":1}"#).await.unwrap();
    let second = call(&agent, r#"{"turn":2}"#).await.unwrap();
    let a: serde_json::Value = serde_json::from_slice(&first.line).unwrap();
    let b: serde_json::Value = serde_json::from_slice(&second.line).unwrap();
    assert_eq!(a["pid"], b["pid"], "one process serves every call");
    assert_eq!(a["greeting"], "hello", "the environment is passed");
    // stderr is collected concurrently: it may arrive a moment after the answer.
    let mut log = first.log + &second.log;
    for _ in 0..50 {
        if log.contains(r#"got {"turn":2}"#) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        log.push_str(&call(&agent, "{}").await.unwrap().log);
    }
    assert!(log.contains(r#"got {"turn":1}"#), "{log}");
    agent.close().await;
}

#[tokio::test]
async fn a_process_per_call_gets_the_payload_without_newline_and_stdin_closed() {
    let agent = process(
        r#"input=$(cat); printf '{"echo":%s,"pid":%s}' "$input" $$"#,
        ProcessMode::PerCall,
    );
    let first = call(&agent, r#"{"task":"a"}"#).await.unwrap();
    let second = call(&agent, r#"{"task":"b"}"#).await.unwrap();
    let a: serde_json::Value = serde_json::from_slice(&first.line).unwrap();
    let b: serde_json::Value = serde_json::from_slice(&second.line).unwrap();
    assert_eq!(a["echo"]["task"], "a");
    assert_eq!(b["echo"]["task"], "b");
    assert_ne!(a["pid"], b["pid"], "a fresh process per call");
}

/// An agent that prints more than a pipe holds before reading a request larger than one
/// (valid for the harness, which writes and reads at once) answers instead of deadlocking.
#[tokio::test]
async fn a_per_call_process_that_answers_before_reading_a_large_request_answers() {
    let agent = process(
        r#"head -c 100000 /dev/zero | tr '\0' x | sed 's/.*/{"a":"&"}/'; cat >/dev/null"#,
        ProcessMode::PerCall,
    );
    let request = format!(r#"{{"task":"{}"}}"#, "y".repeat(200_000));
    let started = Instant::now();
    let reply = agent
        .call(request.as_bytes(), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(reply.line.len(), 100_008);
    assert!(started.elapsed() < Duration::from_secs(4));
}

#[tokio::test]
async fn a_process_per_call_has_all_of_its_stderr_in_the_log() {
    // The log written just before exiting (60 KB: several reads of the pipe) is all there,
    // every time: the call waits for the end of stderr, not only for the exit.
    let agent = process(
        r#"cat >/dev/null; echo '{"ok":true}'; head -c 60000 /dev/zero | tr '\0' x >&2; echo END >&2"#,
        ProcessMode::PerCall,
    );
    for _ in 0..20 {
        let reply = call(&agent, "{}").await.unwrap();
        assert_eq!(text(&reply), r#"{"ok":true}"#);
        assert_eq!(reply.log.len(), 60_004, "{}", reply.log.len());
        assert!(reply.log.ends_with("END\n"));
    }
}

/// A per-call agent that printed its answer and then did not end is told apart from one
/// that never answered: how it fails to end says what to fix.
#[tokio::test]
async fn a_per_call_process_that_answers_but_does_not_end_says_so() {
    let call_briefly = |agent: LineTransport| async move {
        agent
            .call(b"{}", Duration::from_millis(600))
            .await
            .map(|r| text(&r).to_owned())
    };
    for (command, said) in [
        (
            r#"cat >/dev/null; echo '{"ok":true}'; sleep 30"#,
            "printed 12 bytes, but neither closed its stdout nor exited",
        ),
        (
            r#"cat >/dev/null; echo '{"ok":true}'; exec 1>&-; sleep 30"#,
            "printed 12 bytes and closed its stdout, but had not exited",
        ),
        (
            r#"cat >/dev/null; echo '{"ok":true}'; sleep 30 & exit 0"#,
            "printed 12 bytes and exited (exit status: 0), but a process it started",
        ),
        ("cat >/dev/null; sleep 30", "no answer within 600ms"),
    ] {
        let result = call_briefly(process(command, ProcessMode::PerCall)).await;
        let message = match result {
            Err(fault) => {
                assert_eq!(fault.category, FaultCategory::Timeout, "{fault:?}");
                fault.message
            }
            Ok(reply) => panic!("{command}: expected a timeout, got {reply:?}"),
        };
        assert!(message.contains(said), "{command}: {message}");
    }
}

#[tokio::test]
async fn a_crashing_process_is_a_fault_with_its_stderr() {
    let per_call = process("echo 'Traceback: boom' >&2; exit 3", ProcessMode::PerCall);
    let message = fault(call(&per_call, "{}").await, FaultCategory::Transport);
    assert!(message.contains("exit status: 3"), "{message}");
    assert!(message.contains("boom"), "{message}");

    let long_lived = process(
        "read -r line; echo 'dying' >&2; exit 4",
        ProcessMode::LongLived,
    );
    let message = fault(call(&long_lived, "{}").await, FaultCategory::Transport);
    // A pipe, said as one.
    assert!(
        message.contains("closed its stdout without answering"),
        "{message}"
    );
    assert!(message.contains("exit status: 4"), "{message}");
    assert!(message.contains("dying"), "{message}");
    // The next call starts the agent again.
    let message = fault(call(&long_lived, "{}").await, FaultCategory::Transport);
    assert!(message.contains("dying"), "{message}");
}

/// A long-lived agent that dies on a request without answering is started again and sent
/// the request once more; the turn's log says so (its own log shows the request twice).
#[tokio::test]
async fn a_request_sent_again_to_a_restarted_process_is_said_on_the_turn() {
    let dir = tempfile::tempdir().unwrap();
    let mark = dir.path().join("died");
    let agent = process(
        &format!(
            r#"while read -r line; do if [ -e {m} ]; then echo '{{"ok":2}}'; else case "$line" in *second*) touch {m}; exit 1;; esac; echo '{{"ok":1}}'; fi; done"#,
            m = mark.display()
        ),
        ProcessMode::LongLived,
    );
    let first = call(&agent, r#"{"first":1}"#).await.unwrap();
    assert_eq!(text(&first), r#"{"ok":1}"#);
    assert!(!first.log.contains("sent again"), "{}", first.log);
    let second = call(&agent, r#"{"second":1}"#).await.unwrap();
    assert_eq!(text(&second), r#"{"ok":2}"#);
    assert!(
        second
            .log
            .contains("the request was sent again on a new process"),
        "{}",
        second.log
    );
    agent.close().await;
}

/// A fresh process that dies on its first request is a fault, not started again for it,
/// even when the process before it (which had answered) ended since.
#[tokio::test]
async fn a_fresh_process_that_dies_on_its_first_request_is_not_sent_it_again() {
    let dir = tempfile::tempdir().unwrap();
    let (mark, started) = (dir.path().join("answered"), dir.path().join("started"));
    let agent = process(
        &format!(
            r#"echo x >> {s}; if [ -e {m} ]; then read -r l; exit 1; fi; touch {m}; read -r line; echo '{{"ok":1}}'"#,
            s = started.display(),
            m = mark.display()
        ),
        ProcessMode::LongLived,
    );
    assert_eq!(text(&call(&agent, "{}").await.unwrap()), r#"{"ok":1}"#);
    // The first process exits once it has answered.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let message = fault(call(&agent, "{}").await, FaultCategory::Transport);
    assert!(!message.contains("sent again"), "{message}");
    let count = std::fs::read_to_string(&started).unwrap().lines().count();
    assert_eq!(count, 2, "a process for each call, none for a resend");
    agent.close().await;
}

/// An answer the decoder refuses keeps what the process logged on stderr before it.
#[tokio::test]
async fn a_refused_answer_keeps_the_process_log() {
    let agent = process(
        r#"while read -r line; do echo "traceback: KeyError task" >&2; sleep 0.05; echo 'not json'; done"#,
        ProcessMode::LongLived,
    );
    let decode = json;
    let (_, refused) = agent
        .call_decoded(b"{}", Duration::from_secs(5), decode, |_| false)
        .await;
    let fault = refused.unwrap_err();
    assert_eq!(fault.category, FaultCategory::InvalidJson);
    assert!(
        fault.message.contains("traceback: KeyError task"),
        "{fault:?}"
    );
    agent.close().await;
}

fn alive(pid: u32) -> bool {
    PathBuf::from(format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.contains(") Z "))
            .unwrap_or(true)
}

#[tokio::test]
async fn a_silent_process_times_out_and_its_whole_tree_is_ended() {
    for mode in [ProcessMode::LongLived, ProcessMode::PerCall] {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild.pid");
        let agent = process(
            &format!("sleep 30 & echo $! > {}; wait", pidfile.display()),
            mode,
        );
        let started = std::time::Instant::now();
        let result = agent.call(b"{}", Duration::from_millis(400)).await;
        let message = fault(result, FaultCategory::Timeout);
        assert!(message.contains("400ms"), "{message}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let pid: u32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        for _ in 0..50 {
            if !alive(pid) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            !alive(pid),
            "{mode:?}: the agent's child process outlived the timeout"
        );
    }
}

#[tokio::test]
async fn a_twenty_megabyte_line_is_too_large_without_reading_it_all() {
    for mode in [ProcessMode::LongLived, ProcessMode::PerCall] {
        let agent = process("head -c 20000000 /dev/zero | tr '\\0' a; echo", mode);
        let message = fault(call(&agent, "{}").await, FaultCategory::TooLarge);
        assert!(message.contains("1048576"), "{message}");
    }
}

#[tokio::test]
async fn a_process_that_cannot_start_is_a_setup_fault() {
    let agent = LineTransport::new(
        LineEndpoint::Process(ProcessSpec {
            command: "true".into(),
            env: vec![],
            cwd: Some("/nonexistent/trellis/dir".into()),
            mode: ProcessMode::LongLived,
        }),
        LIMITS,
        true,
    );
    let message = fault(call(&agent, "{}").await, FaultCategory::Setup);
    assert!(message.contains("could not start"), "{message}");
    // The directory is what is missing, not the command.
    assert!(
        message.contains("working directory /nonexistent/trellis/dir (`cwd`) is not a directory"),
        "{message}"
    );
}

/// The shell starts, but the command it is asked to run does not exist or cannot be run.
#[tokio::test]
async fn a_command_the_shell_cannot_run_is_a_setup_fault_in_both_modes() {
    for mode in [ProcessMode::LongLived, ProcessMode::PerCall] {
        for command in ["/nonexistent/trellis-agent --serve", "/dev/null"] {
            let message = fault(
                call(&process(command, mode), "{}").await,
                FaultCategory::Setup,
            );
            assert!(
                message.contains("126") || message.contains("127"),
                "{mode:?} {command}: {message}"
            );
        }
    }
}

#[test]
fn socket_addresses_in_both_spellings() {
    assert_eq!(
        LineEndpoint::socket("tcp://127.0.0.1:9000"),
        Ok(LineEndpoint::Tcp("127.0.0.1:9000".into()))
    );
    assert_eq!(
        LineEndpoint::socket("tcp:localhost:9000"),
        Ok(LineEndpoint::Tcp("localhost:9000".into()))
    );
    assert_eq!(
        LineEndpoint::socket("unix:///tmp/agent.sock"),
        Ok(LineEndpoint::Unix("/tmp/agent.sock".into()))
    );
    assert_eq!(
        LineEndpoint::socket("unix:/tmp/agent.sock"),
        Ok(LineEndpoint::Unix("/tmp/agent.sock".into()))
    );
    for bad in [
        "tcp://host",
        "tcp:host:port",
        "unix://relative",
        "http://x:1",
        "unix:",
    ] {
        assert!(LineEndpoint::socket(bad).is_err(), "{bad}");
    }
}

/// A line server: answers each request line with `answer(line)`; `None` closes the
/// connection instead. Counts connections.
async fn line_server(answer: fn(&str) -> Option<String>) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    match answer(&line) {
                        Some(reply) => {
                            if write.write_all(reply.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                        None => return,
                    }
                }
            });
        }
    });
    (address, connections)
}

#[tokio::test]
async fn tcp_a_connection_per_call_or_kept_open() {
    let (address, connections) = line_server(|line| Some(format!("{{\"echo\":{line}}}\n"))).await;
    let endpoint = LineEndpoint::socket(&format!("tcp:{address}")).unwrap();
    let per_call = LineTransport::new(endpoint.clone(), LIMITS, false);
    for i in 0..3 {
        let reply = call(&per_call, &format!("{{\"i\":{i}}}")).await.unwrap();
        assert_eq!(text(&reply), format!("{{\"echo\":{{\"i\":{i}}}}}"));
    }
    assert_eq!(connections.load(Ordering::SeqCst), 3);
    let kept = LineTransport::new(endpoint, LIMITS, true);
    for _ in 0..3 {
        call(&kept, "{}").await.unwrap();
    }
    assert_eq!(connections.load(Ordering::SeqCst), 4);
}

/// A connection of the call's own: a second line after the answer is the agent answering
/// twice (a fault, as on a kept connection, not silently dropped); a whole JSON answer
/// without its newline, then the connection closed, is the answer.
#[tokio::test]
async fn a_connection_per_call_answered_twice_or_closed_after_its_answer() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                let Ok(Some(line)) = lines.next_line().await else {
                    return;
                };
                let answer = if line.contains("twice") {
                    format!("{{\"first\":{line}}}\n{{\"second\":{line}}}\n")
                } else if line.contains("cut") {
                    r#"{"half":"#.to_owned()
                } else {
                    format!("{{\"echo\":{line}}}")
                };
                let _ = write.write_all(answer.as_bytes()).await;
                let _ = write.shutdown().await;
            });
        }
    });
    let per_call = LineTransport::new(LineEndpoint::Tcp(address), LIMITS, false);
    let decode = json;
    let (_, twice) = per_call
        .call_decoded(br#"{"twice":1}"#, Duration::from_secs(5), decode, |_| false)
        .await;
    let twice = twice.unwrap_err();
    assert_eq!(twice.category, FaultCategory::Protocol, "{twice:?}");
    assert!(
        twice
            .message
            .contains("wrote another line after its answer")
            && twice.message.contains("second"),
        "{twice:?}"
    );
    let (_, closed) = per_call
        .call_decoded(br#"{"i":1}"#, Duration::from_secs(5), decode, |_| false)
        .await;
    assert_eq!(closed.unwrap().0, serde_json::json!({"echo": {"i": 1}}));
    // Cut short is still cut short.
    let message = fault(
        call(&per_call, r#"{"cut":1}"#).await,
        FaultCategory::Transport,
    );
    assert!(
        message.contains("in the middle of its answer line"),
        "{message}"
    );
}

#[tokio::test]
async fn a_kept_connection_that_sent_a_line_the_decoder_refused_is_ended() {
    // A log line before the answer when asked to log: the answer stays behind it.
    let (address, connections) = line_server(|line| {
        let stray = if line.contains("log") {
            "INFO working\n"
        } else {
            ""
        };
        Some(format!("{stray}{{\"echo\":{line}}}\n"))
    })
    .await;
    let kept = LineTransport::new(LineEndpoint::Tcp(address), LIMITS, true);
    let decode = json;
    let (_, first) = kept
        .call_decoded(br#"{"log":1}"#, Duration::from_secs(5), decode, |_| false)
        .await;
    assert_eq!(first.unwrap_err().category, FaultCategory::InvalidJson);
    for i in 0..3 {
        let request = format!("{{\"i\":{i}}}");
        let (_, reply) = kept
            .call_decoded(request.as_bytes(), Duration::from_secs(5), decode, |_| {
                false
            })
            .await;
        assert_eq!(reply.unwrap().0, serde_json::json!({"echo": {"i": i}}));
    }
    // One connection for the refused answer, one kept for the rest.
    assert_eq!(connections.load(Ordering::SeqCst), 2);
}

/// A kept connection's answer followed by another line, in the same write (the answer is
/// refused: the second line would answer the next call) or after it (that line is dropped
/// with the connection before the next request, which gets its own answer on a new one).
#[tokio::test]
async fn a_line_after_the_answer_never_answers_the_next_call() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let answer = format!("{{\"echo\":{line}}}\n");
                    let sent = if line.contains("twice") {
                        write
                            .write_all(format!("{answer}{answer}").as_bytes())
                            .await
                    } else if line.contains("late") {
                        let first = write.write_all(answer.as_bytes()).await;
                        tokio::time::sleep(Duration::from_millis(30)).await;
                        first.and(write.write_all(answer.as_bytes()).await)
                    } else {
                        write.write_all(answer.as_bytes()).await
                    };
                    if sent.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let kept = LineTransport::new(LineEndpoint::Tcp(address), LIMITS, true);
    let message = fault(call(&kept, r#"{"twice":1}"#).await, FaultCategory::Protocol);
    assert!(
        message.contains("wrote another line after its answer"),
        "{message}"
    );
    assert_eq!(
        text(&call(&kept, r#"{"i":1}"#).await.unwrap()),
        r#"{"echo":{"i":1}}"#
    );
    // The late line arrives after its answer was taken.
    call(&kept, r#"{"late":1}"#).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let reply = call(&kept, r#"{"i":2}"#).await.unwrap();
    assert_eq!(text(&reply), r#"{"echo":{"i":2}}"#);
    assert!(
        reply.log.contains("after its previous answer"),
        "{}",
        reply.log
    );
    // The first connection ended with the refused answer, the second with the late line.
    assert_eq!(connections.load(Ordering::SeqCst), 3);
}

/// A kept process that logs to stdout right after its answer, in a write of its own
/// (`print(answer, flush=True)` then `print("handled")`): the log line is the process's,
/// not the answer to the next request, however soon that request follows.
#[tokio::test]
async fn a_log_line_right_after_an_answer_never_answers_the_next_call() {
    let agent = process(
        r#"exec python3 -u -c '
import json, os, sys
for line in sys.stdin:
    os.write(1, (json.dumps({"echo": json.loads(line)}) + "\n").encode())
    os.write(1, b"handled request\n")
'"#,
        ProcessMode::LongLived,
    );
    // Each call gets its own answer, refused when the log line came with it (a `protocol`
    // fault), or with the line dropped before the next call, which says so; never the log
    // line as its answer. (Which of the first two happens is the machine's timing; the
    // misreading this guards against needs the line to arrive just after the next request
    // was written, which an idle machine rarely shows here.)
    let mut seen = 0;
    for i in 0..10 {
        let request = format!(r#"{{"i":{i}}}"#);
        match call(&agent, &request).await {
            Ok(reply) => {
                let answer: serde_json::Value = serde_json::from_slice(&reply.line).unwrap();
                assert_eq!(answer, serde_json::json!({"echo": {"i": i}}), "call {i}");
                seen += usize::from(
                    reply
                        .log
                        .contains("\"handled request\" after its previous answer"),
                );
            }
            Err(fault) => {
                assert_eq!(
                    fault.category,
                    FaultCategory::Protocol,
                    "call {i}: {fault:?}"
                );
                assert!(
                    fault
                        .message
                        .contains("wrote another line after its answer"),
                    "call {i}: {fault:?}"
                );
                seen += 1;
            }
        }
    }
    // The first call's line is seen by the second call at the latest.
    assert!(seen > 0, "no call saw a log line");
}

/// A kept TCP connection to an agent that writes each answer twice, in two writes with
/// Nagle's algorithm on (as Python's `sendall` does): the second write is held until the
/// first is acknowledged, which a delayed acknowledgement left to the next request, so the
/// held line arrived as that request's answer and every answer after it was one behind.
/// Each call now gets its own answer, or a fault saying the agent answered twice.
#[tokio::test]
async fn tcp_a_kept_connection_never_takes_a_held_second_line_as_the_next_answer() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = stream.set_nodelay(false);
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let answer = format!("{{\"echo\":{line}}}\n");
                    let times = if line.contains("twice") { 2 } else { 1 };
                    for _ in 0..times {
                        if write.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    let kept = LineTransport::new(LineEndpoint::Tcp(address), LIMITS, true);
    for i in 0..20 {
        // Every third call is answered twice; the others once.
        let request = if i % 3 == 0 {
            format!("{{\"i\":{i},\"twice\":true}}")
        } else {
            format!("{{\"i\":{i}}}")
        };
        match call(&kept, &request).await {
            Ok(reply) => assert_eq!(text(&reply), format!("{{\"echo\":{request}}}"), "call {i}"),
            Err(fault) => {
                assert!(i % 3 == 0, "call {i}, answered once, failed: {fault:?}");
                assert_eq!(
                    fault.category,
                    FaultCategory::Protocol,
                    "call {i}: {fault:?}"
                );
                assert!(
                    fault
                        .message
                        .contains("wrote another line after its answer"),
                    "call {i}: {fault:?}"
                );
            }
        }
    }
}

#[tokio::test]
async fn tcp_an_empty_reply_or_a_refused_connection_is_a_fault() {
    let (address, _) = line_server(|_| None).await;
    let agent = LineTransport::new(LineEndpoint::Tcp(address), LIMITS, false);
    let message = fault(call(&agent, "{}").await, FaultCategory::Transport);
    assert!(
        message.contains("closed the connection without answering"),
        "{message}"
    );

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = listener.local_addr().unwrap().to_string();
    drop(listener);
    let agent = LineTransport::new(LineEndpoint::Tcp(closed), LIMITS, false);
    fault(call(&agent, "{}").await, FaultCategory::Connect);
}

#[tokio::test]
async fn tcp_a_silent_server_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let agent = LineTransport::new(LineEndpoint::Tcp(address), LIMITS, true);
    let result = agent.call(b"{}", Duration::from_millis(300)).await;
    let message = fault(result, FaultCategory::Timeout);
    assert!(message.contains("300ms"), "{message}");
}

#[tokio::test]
async fn unix_sockets_work_in_both_spellings() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.sock");
    let listener = UnixListener::bind(&path).unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let _ = write
                        .write_all(format!("{{\"unix\":{line}}}\n").as_bytes())
                        .await;
                }
            });
        }
    });
    for address in [
        format!("unix://{}", path.display()),
        format!("unix:{}", path.display()),
    ] {
        let agent = LineTransport::new(LineEndpoint::socket(&address).unwrap(), LIMITS, true);
        let reply = call(&agent, "1").await.unwrap();
        assert_eq!(text(&reply), r#"{"unix":1}"#);
    }
}

/// A line server that answers each request line after `delay`.
async fn slow_line_server(delay: Duration) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                while let Ok(Some(_)) = lines.next_line().await {
                    tokio::time::sleep(delay).await;
                    if write.write_all(b"{}\n").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    address
}

#[tokio::test]
async fn calls_on_their_own_connections_run_side_by_side_and_a_shared_one_queues() {
    let delay = Duration::from_millis(400);
    let endpoint = LineEndpoint::socket(&format!("tcp:{}", slow_line_server(delay).await)).unwrap();
    let concurrent = |transport: Arc<LineTransport>| async move {
        let started = Instant::now();
        let calls = (0..4).map(|_| {
            let transport = transport.clone();
            async move { transport.call_queued(b"{}", Duration::from_secs(10)).await }
        });
        let results = futures::future::join_all(calls).await;
        let mut queued: Vec<Duration> = results
            .into_iter()
            .map(|(queued, reply)| {
                reply.unwrap();
                queued
            })
            .collect();
        queued.sort();
        (started.elapsed(), queued)
    };

    let (took, queued) = concurrent(Arc::new(LineTransport::new(
        endpoint.clone(),
        LIMITS,
        false,
    )))
    .await;
    assert!(took < delay * 3, "a connection per call: {took:?}");
    assert!(queued.iter().all(Duration::is_zero), "{queued:?}");

    // One kept-open connection answers one call at a time: the others wait, and say so.
    let (took, queued) = concurrent(Arc::new(LineTransport::new(endpoint, LIMITS, true))).await;
    assert!(took >= delay * 4, "{took:?}");
    assert!(queued[0] < delay, "{queued:?}");
    assert!(queued[3] >= delay * 3, "{queued:?}");
}
