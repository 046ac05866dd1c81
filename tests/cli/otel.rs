//! OpenTelemetry through the `trellis` binary: a third-party agent instrumented with the
//! OpenTelemetry Python SDK (`tests/cli/otel/agent.py`, the SDK's own OTLP/HTTP protobuf
//! exporter and batch processor) sends its spans to `--otlp-receiver`; its tool calls are
//! only in those spans, and the tool criteria read them. The builtin `forecast` agent does
//! the same from inside the binary with `spans #true`. The tests fail, saying how to
//! install it, when no Python with the SDK is found (`TRELLIS_PYTHON` names one; `.ci/run`
//! installs it).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use polars_core::prelude::*;

use crate::{read_parquet, repo, stderr, stdout, strings, trellis};

/// A Python that has the OpenTelemetry SDK and its OTLP/HTTP exporter.
fn python() -> PathBuf {
    let candidates: Vec<PathBuf> = match std::env::var_os("TRELLIS_PYTHON") {
        Some(p) => vec![PathBuf::from(p)],
        None => vec!["python3".into(), "python".into()],
    };
    for python in &candidates {
        let ok = Command::new(python)
            .args([
                "-c",
                "import opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http, \
                 opentelemetry.proto",
            ])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return python.clone();
        }
    }
    panic!(
        "the OpenTelemetry tests run an agent instrumented with the OpenTelemetry Python SDK, \
         and no Python importing it was found ({candidates:?}); install it with `python3 -m \
         pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http \
         opentelemetry-proto`, or set \
         TRELLIS_PYTHON to a Python that has it"
    );
}

/// A free port on 127.0.0.1 for the receiver: the agent must know where to export before
/// the run starts, as a real deployment's agent would.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// The SDK-instrumented agent, exporting to `receiver`; stops when dropped.
struct PythonAgent {
    child: Child,
    port: u16,
}

impl PythonAgent {
    fn start(receiver: u16) -> Self {
        PythonAgent::start_with(receiver, &[])
    }

    fn start_with(receiver: u16, env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(python())
            .arg(repo("tests/cli/otel/agent.py"))
            .envs(env.iter().copied())
            .env(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("http://127.0.0.1:{receiver}"),
            )
            // Batches go out every 50 ms: late enough to be batched, soon enough for a turn.
            .env("OTEL_BSP_SCHEDULE_DELAY", "50")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python started");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("piped stdout");
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("the agent did not print its port: {line:?}"));
        PythonAgent { child, port }
    }
}

impl Drop for PythonAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn suite(agent_port: u16) -> String {
    format!(
        r##"agent "weather" protocol="http" url="http://127.0.0.1:{agent_port}/chat" {{
    spans #true
    request #"{{"message": {{{{ user | tojson }}}}}}"#
    reply json-path="$.reply"
}}
agent "untraced" protocol="http" url="http://127.0.0.1:{agent_port}/chat" {{
    request #"{{"message": {{{{ user | tojson }}}}}}"#
    reply json-path="$.reply"
}}

scenario "inside" {{
    agent "weather"
    user "What is the weather in Paris?"
    expect {{
        reply contains="sunny in Paris"
        tool "lookup_city" city="Paris"
        tool "get_weather" city="Paris" count=1
        tools-in-order "lookup_city" "get_weather"
        no-tool "refund"
        span "execute_tool get_time" gen_ai.tool.call.id="c3"
        span-count "execute_tool get_weather" max=1
    }}
    user "refund A-17"
    expect tool "refund" order="A-17"
    criteria {{
        spans-in-order "execute_tool lookup_city" "execute_tool get_weather" "execute_tool refund"
        span-duration "invoke_agent weather-agent" max="5s"
    }}
}}

// The weather and the time are fetched at once: not one after the other.
scenario "parallel" {{
    agent "weather"
    user "What is the weather in Oslo?"
    expect tools-in-order "get_weather" "get_time"
}}

// Without `spans #true` nothing waits for spans: they arrive after the turn, as late rows.
scenario "late" {{
    agent "untraced"
    user "What is the weather in Rome?"
    expect no-error
}}
"##
    )
}

fn span_rows(out: &Path) -> DataFrame {
    read_parquet(&out.join("spans.parquet"))
}

/// The hidden-acceptance shape: tool calls visible only in a third-party agent's spans,
/// sent by the real OpenTelemetry SDK exporter, decide the tool criteria; parallel calls
/// stay parallel; every span lands in spans.parquet under its turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sdk_instrumented_agents_spans_decide_its_tool_checks() {
    let receiver = free_port();
    let agent = PythonAgent::start(receiver);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("otel.kdl"), suite(agent.port)).unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("otel.kdl"))
        .arg("--out")
        .arg(&out)
        // Written as people write it: `localhost` is the loopback address.
        .arg("--otlp-receiver")
        .arg(format!("localhost:{receiver}"))
        .output()
        .await
        .unwrap();
    let (console, err) = (stdout(&o), stderr(&o));
    assert_eq!(o.status.code(), Some(1), "{console}{err}");
    assert!(
        err.contains(&format!(
            "OTLP receiver for agent spans: http://127.0.0.1:{receiver}"
        )),
        "{err}"
    );
    // The one failure is the order of two calls that ran at once, decided from spans.
    assert!(console.contains("2 passed, 1 failed"), "{console}");
    assert!(console.contains("FAIL otel/parallel"), "{console}");
    assert!(
        console.contains(
            "calls were: lookup_city, [get_weather ‖ get_time] (tool calls from the agent's spans)"
        ),
        "{console}"
    );

    let turns = read_parquet(&out.join("turns.parquet"));
    let spans = span_rows(&out);
    let trace_ids: Vec<Option<String>> = strings(&turns, "trace_id");
    let run_trace = trace_ids[0].clone().expect("a trace id");
    assert!(
        trace_ids.iter().all(|t| t.as_ref() == Some(&run_trace)),
        "{turns}"
    );
    assert!(
        strings(&spans, "trace_id")
            .iter()
            .all(|t| t.as_ref() == Some(&run_trace))
    );

    // Every turn's traceparent reached the agent: its root span's parent is the turn span.
    let scenario = strings(&turns, "scenario");
    let span_ids = strings(&turns, "span_id");
    let parents = strings(&spans, "parent_span_id");
    let names = strings(&spans, "name");
    for (i, span_id) in span_ids.iter().enumerate() {
        let roots = parents
            .iter()
            .zip(&names)
            .filter(|(p, n)| *p == span_id && n.as_deref() == Some("invoke_agent weather-agent"))
            .count();
        assert_eq!(roots, 1, "turn {i} of {:?}: {spans}", scenario[i]);
    }
    // Two turns with 4 and 2 spans, one with 4, all on time; the untraced agent's 4 late.
    let late: Vec<Option<bool>> = spans
        .column("late")
        .unwrap()
        .bool()
        .unwrap()
        .iter()
        .collect();
    let span_scenarios = strings(&spans, "scenario");
    for (scenario, want_late, count) in [
        ("inside", false, 6),
        ("parallel", false, 4),
        ("late", true, 4),
    ] {
        let rows: Vec<usize> = (0..spans.height())
            .filter(|&r| span_scenarios[r].as_deref() == Some(scenario))
            .collect();
        assert_eq!(rows.len(), count, "{scenario}: {spans}");
        assert!(
            rows.iter().all(|&r| late[r] == Some(want_late)),
            "{scenario}: {spans}"
        );
    }
    let attributes = strings(&spans, "attributes");
    assert!(
        attributes
            .iter()
            .flatten()
            .any(|a| a.contains(r#""gen_ai.tool.call.result":"{\"sky\": \"sunny\"}""#)),
        "{attributes:?}"
    );
    assert!(
        strings(&spans, "service")
            .iter()
            .all(|s| s.as_deref() == Some("weather-agent"))
    );
    drop(agent);
}

/// The builtin `forecast` agent gets the receiver's address handed to it (`spans #true`,
/// no `--otlp-receiver`): its tool calls, never on the wire, pass the tool criteria.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builtin_forecast_agents_tools_are_read_from_its_spans() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(repo("suites/opentelemetry.kdl"))
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    // The builtin is handed the receiver's address: nothing to tell the user.
    assert!(
        !stderr(&o).contains("OTLP receiver for agent spans"),
        "{}",
        stderr(&o)
    );
    let criteria = read_parquet(&out.join("criteria.parquet"));
    let details = strings(&criteria, "detail");
    assert!(
        details
            .iter()
            .flatten()
            .any(|d| d.contains("(tool calls from the agent's spans)")),
        "{details:?}"
    );
    assert!(span_rows(&out).height() >= 4);
    // The report draws each turn's spans as a waterfall under the turn.
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains(r#"<span class="span-name d1">execute_tool get_weather</span>"#));
    assert!(html.contains(r#"<span class="span-name d0">invoke_agent forecast</span>"#));
}

/// The end of a run waits (`--spans-grace`) only for spans an agent could send: with the
/// receiver started for a `spans #true` agent, a turn of another agent (never told the
/// receiver's address) does not hold the run's end; with `--otlp-receiver` given, any agent
/// may export to it, and the end waits for its turn's root span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_waits_at_its_end_only_for_spans_an_agent_could_send() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        r##"agent "forecast" protocol="http" builtin="forecast" {
    spans #true
    request #"{"message": {{ user | tojson }}}"#
    reply json-path="$.reply"
}
agent "booking" protocol="connexity" builtin="booking"
scenario "weather" {
    agent "forecast"
    user "What is the weather in Paris?"
    expect tool "get_weather" city="Paris"
}
scenario "book" {
    agent "booking"
    user "Hi, I'd like to book a duct cleaning."
    expect reply contains="postal code"
}
"##,
    )
    .unwrap();
    let run = |out: &str, extra: &[&str]| {
        let mut command = trellis();
        command
            .arg("run")
            .arg(&suite)
            .arg("--out")
            .arg(dir.path().join(out))
            .args(extra)
            .kill_on_drop(true);
        async move {
            let started = std::time::Instant::now();
            // Far longer than the run takes, far shorter than the grace it must not wait.
            let o = tokio::time::timeout(std::time::Duration::from_secs(60), command.output())
                .await
                .expect("the run's end waited for spans the booking agent cannot send")
                .unwrap();
            (o, started.elapsed())
        }
    };
    let (o, _) = run("out", &["--spans-grace", "600s"]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(span_rows(&dir.path().join("out")).height() >= 2);
    assert!(!stderr(&o).contains("waiting up to"), "{}", stderr(&o));

    let (o, took) = run(
        "given",
        &["--spans-grace", "2s", "--otlp-receiver", "127.0.0.1:0"],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        took >= std::time::Duration::from_secs(2),
        "the booking agent may export to a given receiver: its turn is waited for ({took:?})"
    );
    // The pause after the last result is explained.
    assert!(
        stderr(&o)
            .contains("waiting up to 2s for the agents' spans of 1 turn that has no root span yet"),
        "{}",
        stderr(&o)
    );
}

/// A `spans #true` agent that exports nothing: the first turn that waited in vain says so
/// once, naming the receiver to point the agent at, and the end of the run says what it
/// waits for, instead of sitting silent through both waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_spans_that_do_not_come_are_explained_once() {
    let agent = crate::support::MisbehavingServer::respond(200, crate::support::OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        format!(
            r#"agent "mute" protocol="connexity" url="{}" {{
    spans #true
}}
scenario "s" {{
    repeat 2
    user "hello"
    user "again"
}}
"#,
            agent.url()
        ),
    )
    .unwrap();
    let o = trellis()
        .arg("run")
        .arg(&suite)
        .arg("--out")
        .arg(dir.path().join("out"))
        .args(["--spans-wait", "300ms", "--spans-grace", "400ms"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let err = stderr(&o);
    let receiver = err
        .lines()
        .find_map(|l| l.strip_prefix("OTLP receiver for agent spans: "))
        .and_then(|l| l.split(' ').next())
        .unwrap_or_else(|| panic!("no receiver line: {err}"));
    let told = format!(
        "no span of agent `mute` arrived within 300ms of its answer (--spans-wait), and each \
         of its turns waits as long: point its OTEL_EXPORTER_OTLP_ENDPOINT at {receiver}"
    );
    assert_eq!(err.matches(&told).count(), 1, "{err}");
    assert!(
        err.contains(
            "waiting up to 400ms for the agents' spans of 4 turns that have no root span yet"
        ),
        "{err}"
    );

    // No wait asked for: nothing waited out, nothing said.
    let o = trellis()
        .arg("run")
        .arg(&suite)
        .arg("--out")
        .arg(dir.path().join("out0"))
        .args(["--spans-wait", "0s", "--spans-grace", "0s"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        !stderr(&o).contains("no span of agent") && !stderr(&o).contains("waiting up to"),
        "{}",
        stderr(&o)
    );
}

/// An agent whose spans come later than `--spans-wait` is first said to send none; when
/// they do arrive (recorded late), the end of the run says so, so that a right endpoint is
/// not taken for a wrong one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_that_arrive_after_the_wait_are_said_to_have_arrived() {
    let receiver = free_port();
    let agent = PythonAgent::start(receiver);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("otel.kdl"), suite(agent.port)).unwrap();
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("otel.kdl"))
        .arg("--out")
        .arg(dir.path().join("out"))
        .arg("--otlp-receiver")
        .arg(format!("127.0.0.1:{receiver}"))
        // The agent exports every 50 ms: later than this wait, within the end's grace.
        .args(["--spans-wait", "1ms", "--spans-grace", "3s"])
        .output()
        .await
        .unwrap();
    let err = stderr(&o);
    assert!(
        err.contains("no span of agent `weather` arrived within 1ms"),
        "{err}"
    );
    assert!(
        err.contains("spans of agent `weather` did arrive, later than 1ms")
            && err.contains("raise --spans-wait"),
        "{err}"
    );
    // Said only of an agent said to send none.
    assert!(!err.contains("of agent `untraced` did arrive"), "{err}");
    drop(agent);
}

/// An agent whose spans reach the receiver, with a turn it traces nothing of: that turn is
/// said to have none, not the agent to send none (its endpoint is right: no advice to
/// point it elsewhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_without_spans_of_an_agent_whose_spans_arrive_is_said_as_such() {
    let receiver = free_port();
    let agent = PythonAgent::start(receiver);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("quiet.kdl"),
        format!(
            r##"agent "weather" protocol="http" url="http://127.0.0.1:{}/chat" {{
    spans #true
    request #"{{"message": {{{{ user | tojson }}}}}}"#
    reply json-path="$.reply"
}}
scenario "s" {{
    user "What is the weather in Paris?"
    expect span "execute_tool get_time"
    user "quiet please"
    expect reply contains="Shh"
}}
"##,
            agent.port
        ),
    )
    .unwrap();
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("quiet.kdl"))
        .arg("--out")
        .arg(dir.path().join("out"))
        .arg("--otlp-receiver")
        .arg(format!("127.0.0.1:{receiver}"))
        .args(["--spans-wait", "2s", "--spans-grace", "1s"])
        .output()
        .await
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{}{err}", stdout(&o));
    assert!(
        err.contains(
            "a turn of agent `weather` got no span within 2s of its answer (--spans-wait), \
             though its earlier turns' spans arrived"
        ),
        "{err}"
    );
    assert!(
        !err.contains("point its OTEL_EXPORTER_OTLP_ENDPOINT"),
        "{err}"
    );
    drop(agent);
}

/// A stop signal during the end's wait for spans ends the wait at once: the run is reported
/// with what it finished, not after the rest of `--spans-grace`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_cuts_the_ends_wait_for_spans_short() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        r#"agent "booking" protocol="connexity" builtin="booking"
scenario "book" {
    repeat 2
    user "Hi, I'd like to book a duct cleaning."
}
"#,
    )
    .unwrap();
    let out = dir.path().join("out");
    let mut child = trellis()
        .arg("run")
        .arg(&suite)
        .arg("--out")
        .arg(&out)
        .args(["--otlp-receiver", "127.0.0.1:0", "--spans-grace", "600s"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let waiting = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.starts_with("waiting up to 10m for the agents' spans of 2 turns") {
                return;
            }
        }
        panic!("the run ended without waiting for spans");
    });
    waiting
        .await
        .expect("no line saying the end waits for spans");
    let pid = i32::try_from(child.id().unwrap()).unwrap();
    // SAFETY: kill(2) on a child process id this test spawned and has not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let signalled = std::time::Instant::now();
    let status = tokio::time::timeout(std::time::Duration::from_secs(30), child.wait())
        .await
        .expect("the signal did not end the wait for spans")
        .unwrap();
    assert_eq!(status.code(), Some(130));
    // Not the 5 s after which a stopping run's calls in flight are abandoned.
    assert!(
        signalled.elapsed() < std::time::Duration::from_millis(4500),
        "the wait for spans outlived the signal: {:?}",
        signalled.elapsed()
    );
    assert_eq!(read_parquet(&out.join("trajectories.parquet")).height(), 2);
}

/// `spans #true` on an agent reached over a socket or a process's pipes, which carry no
/// `traceparent`: `check` warns at the agent instead of every turn waiting in vain.
#[tokio::test]
async fn spans_on_an_agent_no_traceparent_reaches_is_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        "agent \"s\" protocol=\"multiagent\" builtin=\"support\" transport=\"tcp\" {\n    \
         spans #true\n}\nagent \"h\" protocol=\"multiagent\" builtin=\"support\" {\n    \
         spans #true\n}\nscenario \"x\" {\n    agents \"s\" \"h\"\n    user \"hi\"\n    \
         expect no-error\n}\n",
    )
    .unwrap();
    let o = trellis().arg("check").arg(&suite).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("agent `s` has `spans #true`"), "{err}");
    assert!(err.contains("s.kdl:1:7"), "{err}");
    // Over HTTP the header is there: nothing to say.
    assert!(!err.contains("agent `h`"), "{err}");
}

/// An agent that exports to the receiver but does not continue the `traceparent` it is
/// sent: its spans arrive in traces of their own and are dropped, and the notice says so
/// instead of telling the user to point an endpoint that is already right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_of_another_trace_are_named_as_such() {
    let receiver = free_port();
    let agent = PythonAgent::start_with(receiver, &[("AGENT_NO_PROPAGATION", "1")]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("otel.kdl"), suite(agent.port)).unwrap();
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("otel.kdl"))
        .arg("--out")
        .arg(dir.path().join("out"))
        .arg("--otlp-receiver")
        .arg(format!("127.0.0.1:{receiver}"))
        .args(["--spans-wait", "400ms", "--spans-grace", "0s"])
        .output()
        .await
        .unwrap();
    let err = stderr(&o);
    assert!(err.contains("of other traces, dropped"), "{err}");
    assert!(err.contains("`traceparent`"), "{err}");
    assert!(!err.contains("point its"), "{err}");
}

/// A span check on an agent whose spans are not collected is a warning of `check` and a
/// skipped check, saying what to do; a taken port is an error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn span_checks_without_spans_say_how_to_get_them() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        r##"agent "f" protocol="http" builtin="forecast" {
    request #"{"message": {{ user | tojson }}}"#
    reply json-path="$.reply"
}
scenario "s" {
    user "weather in Oslo"
    expect span-count "execute_tool get_weather" min=1
}
"##,
    )
    .unwrap();
    let o = trellis().arg("check").arg(&suite).output().await.unwrap();
    assert!(
        stderr(&o).contains("add `spans #true` to the agent"),
        "{}",
        stderr(&o)
    );
    let o = trellis()
        .arg("run")
        .arg(&suite)
        .arg("--out")
        .arg(dir.path().join("out"))
        .output()
        .await
        .unwrap();
    assert!(
        stdout(&o).contains("no spans were collected for this turn"),
        "{}",
        stdout(&o)
    );

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let o = trellis()
        .arg("run")
        .arg(&suite)
        .arg("--out")
        .arg(dir.path().join("out2"))
        .arg("--otlp-receiver")
        .arg(format!("127.0.0.1:{port}"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stderr(&o).contains(&format!("cannot listen for OTLP spans on 127.0.0.1:{port}")),
        "{}",
        stderr(&o)
    );
    // Nothing of the run is left: no directory to list as a run that never finished.
    assert!(!dir.path().join("out2").exists());
    // Into the runs directory too, with an OTLP setting refused.
    let o = trellis()
        .current_dir(dir.path())
        .arg("run")
        .arg(&suite)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    let listed = trellis()
        .current_dir(dir.path())
        .arg("runs")
        .output()
        .await
        .unwrap();
    assert!(
        !stdout(&listed).contains("unfinished"),
        "{}",
        stdout(&listed)
    );
    let runs: Vec<_> = std::fs::read_dir(dir.path().join("runs"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(runs.is_empty(), "{runs:?}");
}

/// A real OTLP collector (Python, decoding with the `opentelemetry-proto` package), started
/// for one test; stops when dropped.
struct Collector {
    child: Child,
    port: u16,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Collector {
    fn start() -> Self {
        let mut child = Command::new(python())
            .arg(repo("tests/cli/otel/collector.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python started");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut first = String::new();
        stdout.read_line(&mut first).unwrap();
        let port = first
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("the collector did not print its port: {first:?}"));
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Collector { child, port, lines }
    }

    /// Every span received so far. The collector prints a request's spans before it
    /// answers, but the thread that reads its output may not have passed them on yet when
    /// the run has returned (the export's wait is the run's last step): lines are taken until
    /// none has come for 300 ms.
    fn spans(&self) -> Vec<serde_json::Value> {
        let quiet = std::time::Duration::from_millis(300);
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut spans = Vec::new();
        while std::time::Instant::now() < until {
            match self.lines.recv_timeout(quiet) {
                Ok(l) => {
                    spans.push(serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}")))
                }
                Err(_) => break,
            }
        }
        spans
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Trellis's own spans reach a real OTLP collector: the run under the caller's
/// TRACEPARENT, its nodes, turns with the very ids their requests carried, trajectories
/// with their status; OTEL_EXPORTER_OTLP_HEADERS are sent, percent-decoded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runs_own_spans_reach_a_real_collector() {
    let collector = Collector::start();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let o = trellis()
        .arg("run")
        .arg(repo("suites/opentelemetry.kdl"))
        .arg("--out")
        .arg(&out)
        .arg("--otlp-endpoint")
        .arg(format!("http://127.0.0.1:{}", collector.port))
        .env(
            "TRACEPARENT",
            format!("00-{caller_trace}-00f067aa0ba902b7-01"),
        )
        .env("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20t0k")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stderr(&o).contains("OTLP export: 5 spans sent"),
        "{}",
        stderr(&o)
    );
    // The collector prints as it decodes; the run has returned, so it has them all.
    let spans = collector.spans();
    assert_eq!(spans.len(), 5, "{spans:#?}");
    let by_name = |prefix: &str| -> Vec<&serde_json::Value> {
        spans
            .iter()
            .filter(|s| s["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
            .collect()
    };
    assert!(spans.iter().all(|s| s["trace_id"] == caller_trace));
    assert!(
        spans
            .iter()
            .all(|s| s["auth"] == "Bearer t0k" && s["service"] == "trellis")
    );
    let run = by_name("trellis run ");
    assert_eq!(run.len(), 1);
    assert_eq!(run[0]["parent_span_id"], "00f067aa0ba902b7");
    let node = by_name("node opentelemetry/weather-and-refund start");
    assert_eq!(node[0]["parent_span_id"], run[0]["span_id"]);
    let trajectory = by_name("trajectory ");
    assert_eq!(trajectory[0]["parent_span_id"], run[0]["span_id"]);
    assert_eq!(trajectory[0]["attributes"]["trellis.status"], "passed");
    assert_nested(&spans);

    let turns = read_parquet(&out.join("turns.parquet"));
    let exported = by_name("turn ");
    assert_eq!(exported.len(), 2);
    for (span_id, exported) in strings(&turns, "span_id").iter().zip(&exported) {
        assert_eq!(exported["span_id"].as_str(), span_id.as_deref());
        assert_eq!(exported["parent_span_id"], node[0]["span_id"]);
        assert_eq!(
            exported["attributes"]["gen_ai.operation.name"],
            "invoke_agent"
        );
    }
    // The forecast agent's tool calls are only in its spans: counted from them, as the
    // tool checks read them: the lookup, the weather and the time, then the refund.
    let calls: Vec<&serde_json::Value> = exported
        .iter()
        .map(|t| &t["attributes"]["trellis.turn.tool_calls"])
        .collect();
    assert_eq!(calls, [3, 1], "{exported:#?}");
    // The agent's own spans (in spans.parquet) name the exported turn spans as parents,
    // and start inside them: the turns are placed from the run's start to the millisecond
    // (to the second, they came up to a second early and ended before their agent's span).
    let rows = span_rows(&out);
    let parents = strings(&rows, "parent_span_id");
    let starts: Vec<u64> = rows
        .column("start_unix_nano")
        .unwrap()
        .u64()
        .unwrap()
        .iter()
        .map(Option::unwrap)
        .collect();
    let nanos = |v: &serde_json::Value| {
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .unwrap()
    };
    const SLACK: u64 = 5_000_000;
    for turn in &exported {
        let children: Vec<u64> = parents
            .iter()
            .zip(&starts)
            .filter(|(p, _)| p.as_deref() == turn["span_id"].as_str())
            .map(|(_, start)| *start)
            .collect();
        assert!(!children.is_empty(), "{turn}");
        for child in children {
            assert!(
                nanos(&turn["start"]) <= child + SLACK && child <= nanos(&turn["end"]) + SLACK,
                "the agent's span at {child} is outside its turn {turn}"
            );
        }
    }
}

/// OTEL_EXPORTER_OTLP_COMPRESSION=gzip: the collector gets gzip bodies, and every span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_export_reaches_the_collector_whole() {
    let collector = Collector::start();
    let dir = tempfile::tempdir().unwrap();
    let o = trellis()
        .arg("run")
        .arg(repo("suites/opentelemetry.kdl"))
        .arg("--out")
        .arg(dir.path().join("out"))
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{}", collector.port),
        )
        .env("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let spans = collector.spans();
    assert_eq!(spans.len(), 5, "{spans:?}");
    assert!(spans.iter().all(|s| s["encoding"] == "gzip"), "{spans:?}");
}

/// A turn that waited out a rate limit: its exported span runs from its start to its end,
/// the wait included, so the request that got the answer (and carried the turn's span id)
/// falls inside it; its exchange (two attempts) ends with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turns_span_covers_its_wait_out_of_a_rate_limit() {
    use super::support::{Behavior, MisbehavingServer};
    let server = MisbehavingServer::start(Behavior::RateLimited {
        times: 1,
        retry_after: Some("1".into()),
        body: "slow down".into(),
    })
    .await;
    let collector = Collector::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("limited.kdl"),
        format!(
            "agent \"gated\" protocol=\"connexity\" url=\"{}\"\n\
             scenario \"hello\" {{\n    user \"hi\"\n}}\n",
            server.url()
        ),
    )
    .unwrap();
    let o = trellis()
        .arg("run")
        .arg(dir.path())
        .arg("--out")
        .arg(dir.path().join("out"))
        .arg("--otlp-endpoint")
        .arg(format!("http://127.0.0.1:{}", collector.port))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let spans = collector.spans();
    let named = |prefix: &str| {
        spans
            .iter()
            .find(|s| s["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
            .unwrap_or_else(|| panic!("no {prefix} span: {spans:#?}"))
    };
    let nanos = |v: &serde_json::Value| {
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .unwrap()
    };
    let (turn, exchange) = (named("turn "), named("POST "));
    let lasted = nanos(&turn["end"]) - nanos(&turn["start"]);
    assert!(lasted >= 1_000_000_000, "{turn}");
    assert_eq!(exchange["parent_span_id"], turn["span_id"]);
    assert_eq!(nanos(&exchange["end"]), nanos(&turn["end"]), "{exchange}");
    assert!(
        nanos(&exchange["start"]) >= nanos(&turn["start"]),
        "{exchange}"
    );
    let node = named("node ");
    assert!(nanos(&node["end"]) >= nanos(&turn["end"]), "{node}");
}

/// A collector that is down is one warning; the run and its exit code are unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_collector_is_one_warning() {
    let dir = tempfile::tempdir().unwrap();
    let (_held, closed) = crate::refused_port();
    let started = std::time::Instant::now();
    let o = trellis()
        .arg("run")
        .arg(repo("suites/opentelemetry.kdl"))
        .arg("--out")
        .arg(dir.path().join("out"))
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{closed}"),
        )
        .output()
        .await
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{}{err}", stdout(&o));
    assert_eq!(err.matches("warning: OTLP export").count(), 1, "{err}");
    assert!(
        err.contains("OTLP export: 0 spans sent, 5 dropped"),
        "{err}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert!(dir.path().join("out/spans.parquet").exists());
}

/// A collector that takes the spans and does not answer in time: the run ends after its
/// bounded wait and says the spans are unconfirmed, never "0 sent, 0 dropped".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_does_not_answer_leaves_its_spans_unconfirmed() {
    let slow = crate::support::MisbehavingServer::start(crate::support::Behavior::Delayed {
        delay: std::time::Duration::from_secs(30),
        body: String::new(),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let o = trellis()
        .arg("run")
        .arg(repo("suites/opentelemetry.kdl"))
        .arg("--out")
        .arg(dir.path().join("out"))
        .arg("--otlp-endpoint")
        .arg(slow.url())
        .output()
        .await
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{}{err}", stdout(&o));
    assert!(
        err.contains("OTLP export: 0 spans sent, 0 dropped, 5 not confirmed"),
        "{err}"
    );
    assert!(err.contains("did not confirm 5 spans"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    assert_eq!(slow.requests(), 1);
}

/// A trajectory in `error` because its judge gave no usable answer (no fault of the agent)
/// is exported with an error status, as a failed or faulted one is: it was `unset`, which
/// trace viewers show as fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trajectory_whose_judge_failed_is_exported_with_an_error_status() {
    use super::support::llm::{FakeLlm, Reply, Rule};
    let collector = Collector::start();
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::text("no idea")])]).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("judged.kdl");
    std::fs::write(
        &suite,
        format!(
            "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
             provider \"fake\" kind=\"openai\" base-url=\"{}\" model=\"m\"\n\
             judge \"main\" provider=\"fake\"\n\
             scenario \"judged\" {{\n    user \"Hi\"\n    expect judge \"the agent is polite\"\n}}\n",
            fake.base_url()
        ),
    )
    .unwrap();
    let o = trellis()
        .arg("run")
        .arg(&suite)
        .arg("--out")
        .arg(dir.path().join("out"))
        .arg("--otlp-endpoint")
        .arg(format!("http://127.0.0.1:{}", collector.port))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let spans = collector.spans();
    let trajectory = spans
        .iter()
        .find(|s| s["name"] == "trajectory judged/judged main")
        .unwrap_or_else(|| panic!("{spans:#?}"));
    assert_eq!(trajectory["attributes"]["trellis.status"], "error");
    // `STATUS_CODE_ERROR`.
    assert_eq!(trajectory["status"], 2, "{trajectory}");
    assert_nested(&spans);
}

/// Every span lies within its parent's time (a millisecond of slack for the clocks' rounding):
/// trace viewers draw a child outside its parent as broken. Trajectory spans ended at the
/// recorder's clock, after the run's; judge spans began before their trajectory.
fn assert_nested(spans: &[serde_json::Value]) {
    let nanos = |v: &serde_json::Value| {
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .unwrap()
    };
    const SLACK: u64 = 1_000_000;
    for span in spans {
        let Some(parent) = spans
            .iter()
            .find(|p| p["span_id"] == span["parent_span_id"] && !span["parent_span_id"].is_null())
        else {
            continue;
        };
        assert!(
            nanos(&parent["start"]) <= nanos(&span["start"]) + SLACK
                && nanos(&span["end"]) <= nanos(&parent["end"]) + SLACK,
            "{} lies outside its parent {}",
            span["name"],
            parent["name"]
        );
    }
}

/// A simulated user's calls are exported inside the turn whose message they wrote (they lay
/// wholly before it), and the whole tree nests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_users_calls_lie_inside_their_turn() {
    use super::support::llm::{FakeLlm, Reply, Rule};
    let collector = Collector::start();
    let fake = FakeLlm::start(vec![
        Rule::when(
            "Did it break character",
            [Reply::text(
                r#"{"broke_character": false, "reason": "fine"}"#,
            )],
        ),
        Rule::simulator(
            "Book a cleaning",
            [
                Reply::slow(
                    std::time::Duration::from_millis(60),
                    Reply::text("Hi, I need a duct cleaning."),
                ),
                Reply::text("It's V4T 0A7."),
            ],
        ),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("sim.kdl");
    std::fs::write(
        &suite,
        format!(
            "agent \"booking\" protocol=\"connexity\" builtin=\"booking\"\n\
             provider \"fake\" kind=\"openai\" base-url=\"{}\" model=\"m\"\n\
             simulator provider=\"fake\"\n\
             scenario \"s\" {{\n    description \"Book a cleaning\"\n    simulate turns=2\n    \
             expect no-error\n}}\n",
            fake.base_url()
        ),
    )
    .unwrap();
    let o = trellis()
        .arg("run")
        .arg(&suite)
        .arg("--out")
        .arg(dir.path().join("out"))
        .arg("--otlp-endpoint")
        .arg(format!("http://127.0.0.1:{}", collector.port))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let spans = collector.spans();
    assert!(
        spans.iter().any(|s| s["name"] == "chat m"
            && spans.iter().any(|t| t["span_id"] == s["parent_span_id"]
                && t["name"].as_str().is_some_and(|n| n.starts_with("turn ")))),
        "{spans:#?}"
    );
    assert_nested(&spans);
}

/// Branches run after their parent node's turns: the parent's span reaches over them, so the
/// branch nodes, named under it, lie within it (a scripted and a simulated branch; the
/// simulated user's slow reply makes the branch end well after its parent's own turn).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn branch_nodes_lie_within_their_parent_nodes_span() {
    use super::support::llm::{FakeLlm, Reply, Rule};
    let collector = Collector::start();
    let fake = FakeLlm::start(vec![
        Rule::when(
            "Did it break character",
            [Reply::text(
                r#"{"broke_character": false, "reason": "fine"}"#,
            )],
        ),
        Rule::simulator(
            "Book a cleaning",
            [Reply::slow(
                std::time::Duration::from_millis(60),
                Reply::text("It's V4T 0A7."),
            )],
        ),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("branches.kdl");
    std::fs::write(
        &suite,
        format!(
            "agent \"booking\" protocol=\"connexity\" builtin=\"booking\"\n\
             provider \"fake\" kind=\"openai\" base-url=\"{}\" model=\"m\"\n\
             simulator provider=\"fake\"\n\
             scenario \"s\" {{\n    description \"Book a cleaning\"\n    \
             user \"Hi, I'd like to book a duct cleaning.\"\n    \
             branch \"b1\" {{\n        simulate turns=1\n    }}\n    \
             branch \"b2\" {{\n        user \"It's V4T 0A7.\"\n        \
             user \"Tuesday works.\"\n    }}\n    expect no-error\n}}\n",
            fake.base_url()
        ),
    )
    .unwrap();
    let o = trellis()
        .arg("run")
        .arg(&suite)
        .arg("--out")
        .arg(dir.path().join("out"))
        .arg("--otlp-endpoint")
        .arg(format!("http://127.0.0.1:{}", collector.port))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let spans = collector.spans();
    let node = |name: &str| {
        spans
            .iter()
            .find(|s| s["name"].as_str().is_some_and(|n| n.starts_with(name)))
            .unwrap_or_else(|| panic!("no span {name}: {spans:#?}"))
    };
    // The check after the branches is a node of each branch's path: a grandchild.
    let start = node("node branches/s start ");
    for branch in ["b1", "b2"] {
        let child = node(&format!("node branches/s {branch} "));
        assert_eq!(child["parent_span_id"], start["span_id"], "{spans:#?}");
        let merged = node(&format!("node branches/s {branch}/then "));
        assert_eq!(merged["parent_span_id"], child["span_id"], "{spans:#?}");
    }
    // Each node is sent once, with its final range.
    let names: Vec<_> = spans.iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(
        names.iter().filter(|n| n.starts_with("node ")).count(),
        5,
        "{names:?}"
    );
    for s in &spans {
        eprintln!(
            "DBG {} {} {} {} {}",
            s["name"], s["span_id"], s["parent_span_id"], s["start"], s["end"]
        );
    }
    assert_nested(&spans);
}

/// A run stopped and resumed under one `TRACEPARENT` (a CI job's, kept across the retry):
/// the resumed session's spans lie when they happened (they were exported as much later as
/// the first session had run, after the run itself had ended), and no span id repeats
/// across the sessions (node and trajectory ids came from the trace and their keys alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_runs_spans_keep_their_times_and_their_ids_are_unique() {
    use crate::support::{Behavior, MisbehavingServer, OK_BODY};
    let collector = Collector::start();
    let agent = MisbehavingServer::start(Behavior::Delayed {
        delay: std::time::Duration::from_millis(250),
        body: OK_BODY.to_owned(),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("slow.kdl");
    std::fs::write(
        &suite,
        format!(
            "agent \"slow\" protocol=\"connexity\" url=\"{}\"\n\
             scenario \"hello\" {{\n    repeat 8\n    user \"hi\"\n    user \"again\"\n}}\n",
            agent.url()
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let run = |extra: &[&str]| {
        let mut command = trellis();
        command
            .arg("run")
            .arg(&suite)
            .args(["--jobs", "1", "--otlp-endpoint"])
            .arg(format!("http://127.0.0.1:{}", collector.port))
            .args(extra)
            .arg(&out)
            .env("TRACEPARENT", traceparent)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        command
    };
    let first = run(&["--out"]).spawn().unwrap();
    while agent.requests() < 4 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // SAFETY: signalling a child this test started and still owns.
    unsafe {
        libc::kill(first.id().unwrap() as i32, libc::SIGTERM);
    }
    let o = first.wait_with_output().await.unwrap();
    assert_eq!(o.status.code(), Some(143), "{}", stderr(&o));
    let o = run(&["--resume"]).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let ended = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;

    let spans = collector.spans();
    let turns = spans
        .iter()
        .filter(|s| s["name"].as_str().is_some_and(|n| n.starts_with("turn ")))
        .count();
    assert!(turns >= 16, "{turns} turn spans: {spans:#?}");
    let nanos = |v: &serde_json::Value| {
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .unwrap()
    };
    for span in &spans {
        assert!(
            nanos(&span["end"]) <= ended,
            "a span ends {} ms after the resumed run did: {span}",
            (nanos(&span["end"]) - ended) / 1_000_000
        );
    }
    let mut ids: Vec<&str> = spans.iter().filter_map(|s| s["span_id"].as_str()).collect();
    let all = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        ids.len(),
        all,
        "span ids repeat across the sessions: {spans:#?}"
    );
}

/// A collector that answers 503 once (restarting, or shedding load) gets the batch again
/// after a backoff, as the OTLP specification asks: no span is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_answers_503_once_gets_the_spans_again() {
    let collector =
        crate::support::MisbehavingServer::start(crate::support::Behavior::Sequence(vec![
            (503, String::new()),
            (200, String::new()),
        ]))
        .await;
    let dir = tempfile::tempdir().unwrap();
    let o = trellis()
        .arg("run")
        .arg(repo("suites/opentelemetry.kdl"))
        .arg("--out")
        .arg(dir.path().join("out"))
        .arg("--otlp-endpoint")
        .arg(collector.url())
        .output()
        .await
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{}{err}", stdout(&o));
    assert!(err.contains("OTLP export: 5 spans sent"), "{err}");
    assert!(!err.contains("dropped") && !err.contains("failed"), "{err}");
    assert_eq!(collector.requests(), 2);
}

/// A collector that does not answer holds nothing back: every results file is written before
/// the export's wait, and a signal during that wait ends it at once, with the run finished
/// (the wait came first, and a second signal there left only `.partial` tables).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_are_written_before_the_exports_wait_and_a_signal_ends_it() {
    let hung = crate::support::MisbehavingServer::start(crate::support::Behavior::Delayed {
        delay: std::time::Duration::from_secs(30),
        body: String::new(),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut child = trellis()
        .arg("run")
        .arg(repo("suites/opentelemetry.kdl"))
        .arg("--out")
        .arg(&out)
        .arg("--otlp-endpoint")
        .arg(hung.url())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while !out.join("summary.json").exists() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(4),
            "no summary.json before the export's 5s wait ended"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(out.join("junit.xml").exists() && out.join("report.html").exists());
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run did not wait for the export"
    );
    let signalled = std::time::Instant::now();
    // SAFETY: signalling a child this test started and still owns.
    unsafe {
        libc::kill(child.id().unwrap() as i32, libc::SIGTERM);
    }
    let o = child.wait_with_output().await.unwrap();
    assert!(
        signalled.elapsed() < std::time::Duration::from_secs(2),
        "the export's wait went on after SIGTERM"
    );
    assert_eq!(o.status.code(), Some(143), "{}", stderr(&o));
    let listed = trellis()
        .args(["runs", "--json", "--dir"])
        .arg(dir.path())
        .output()
        .await
        .unwrap();
    let runs: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(runs[0]["finished"], true, "{runs}");
    assert_eq!(runs[0]["stopped"], false, "{runs}");
}
