//! The executor end to end: suites loaded from files, a real Connexity agent over HTTP
//! written here, events collected from the stream.

use std::sync::{Arc, Mutex};

use axum::{Json, Router, extract::State, http::StatusCode, routing::post};
use serde_json::{Value, json};
use trellis_engine::record::{CriterionStatus, FaultCategory, TrajectoryStatus};
use trellis_engine::render::EnvSnapshot;

use crate::support::Run;

/// Every request body the agent received.
type Seen = Arc<Mutex<Vec<Value>>>;

/// An agent that echoes the last user message, and answers 500 to "boom".
async fn echo_agent() -> (String, Seen) {
    async fn respond(
        State(seen): State<Seen>,
        Json(body): Json<Value>,
    ) -> (StatusCode, Json<Value>) {
        seen.lock().unwrap().push(body.clone());
        let last = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
            .to_string();
        if last == "boom" {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(json!({"error": "boom"})),
            );
        }
        let mut messages = vec![];
        if last == "look up" {
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{\"order\": 42}"}}
            ]}));
            messages.push(json!({"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": "{\"status\": \"shipped\"}"}));
        }
        messages
            .push(json!({"role": "assistant", "content": format!("echo: {last} (order #A-17)")}));
        (
            StatusCode::OK,
            Json(
                json!({"messages": messages, "usage": {"prompt_tokens": 10, "completion_tokens": 5}}),
            ),
        )
    }
    let seen: Seen = Arc::default();
    let app = Router::new()
        .route("/agent/respond", post(respond))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (format!("http://{addr}/agent/respond"), seen)
}

async fn run_suite(text: &str, jobs: usize) -> Run {
    run_suite_with_env(text, jobs, EnvSnapshot::new()).await
}

/// Runs `text` with `env` as the environment templates see (never the process's).
async fn run_suite_with_env(text: &str, jobs: usize, env: EnvSnapshot) -> Run {
    crate::support::run_suite(text, jobs, env).await
}

const FORKS: &str = r#"
agent "echo" protocol="connexity" url="URL"
scenario "fork" {
    repeat 2
    user "a"
    user "b"
    branch "x" { user "x1" }
    branch "y" {
        user "y1"
        branch "deep1" { user "d1" }
        branch "deep2" { user "d2" }
    }
    user "tail"
    criteria { no-error }
}
"#;

/// `test-case-id` is what a Connexity agent is sent as `metadata.test_case_id` (the
/// platform's case UUID), on every request of the scenario.
#[tokio::test]
async fn a_test_case_id_is_sent_instead_of_the_scenario_id() {
    let (url, seen) = echo_agent().await;
    let suite = format!(
        "agent \"echo\" protocol=\"connexity\" url=\"{url}\"\n\
         scenario \"case\" {{\n    test-case-id \"6f1c2a7e-3b8d-4e0a-9c51-2d7f8e4a1b90\"\n    \
         user \"a\"\n    user \"b\"\n    criteria {{ no-error }}\n}}\n"
    );
    let run = run_suite(&suite, 1).await;
    assert_eq!(run.trajectories[0].status, TrajectoryStatus::Passed);
    let requests = seen.lock().unwrap().clone();
    assert_eq!(requests.len(), 2);
    for r in &requests {
        assert_eq!(
            r["metadata"]["test_case_id"],
            "6f1c2a7e-3b8d-4e0a-9c51-2d7f8e4a1b90"
        );
    }
}

#[tokio::test]
async fn a_forks_shared_prefix_runs_once_per_repetition() {
    let (url, seen) = echo_agent().await;
    let run = run_suite(&FORKS.replace("URL", &url), 8).await;

    // Per repetition: start (2 calls) + x, x/then (2) + y (1) + two deep branches with their
    // tails (4) = 9 calls; replaying prefixes would take 4 + 5 + 5 = 14.
    assert_eq!(seen.lock().unwrap().len(), 18);
    assert_eq!(run.summary.turns, 18);
    let mut names: Vec<_> = run
        .trajectories
        .iter()
        .map(|t| t.trajectory.clone())
        .collect();
    names.sort();
    names.dedup();
    assert_eq!(names, ["x", "y/deep1", "y/deep2"]);
    assert_eq!(run.trajectories.len(), 6);
    assert!(
        run.trajectories
            .iter()
            .all(|t| t.status == TrajectoryStatus::Passed)
    );

    // Every branch continued from the same history: the tail after d1 saw a, b, y1, d1.
    let requests = seen.lock().unwrap().clone();
    let tail_after_d1 = requests
        .iter()
        .find(|r| {
            let m = r["messages"].as_array().unwrap();
            m.last().unwrap()["content"] == "tail" && m.iter().any(|x| x["content"] == "d1")
        })
        .expect("a tail request after d1");
    let users: Vec<&str> = tail_after_d1["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(users, ["a", "b", "y1", "d1", "tail"]);
    // Connexity metadata: the scenario id and the index of the new user message.
    assert_eq!(tail_after_d1["metadata"]["test_case_id"], "fork");
    assert_eq!(tail_after_d1["metadata"]["turn_index"], 8);

    // Trajectories list their execution nodes; the nodes were each recorded once.
    let deep1 = run
        .trajectories
        .iter()
        .find(|t| t.trajectory == "y/deep1")
        .unwrap();
    assert_eq!(deep1.nodes, ["start", "y", "y/deep1", "y/deep1/then"]);
    assert_eq!(deep1.turns, 5);
    assert_eq!(run.nodes.len(), 16);
    let starts = run.nodes.iter().filter(|n| n.node == "start").count();
    assert_eq!(starts, 2);
}

/// A path stopped at `max-turns` stops at a `user` step that took no turn: the checks after
/// it would have checked that step's turn (1 here), not the last one taken.
#[tokio::test]
async fn checks_past_max_turns_name_the_turn_they_would_have_checked() {
    let (url, _) = echo_agent().await;
    let suite = r#"
agent "echo" protocol="connexity" url="URL"
scenario "capped" {
    max-turns 1
    user "one"
    expect reply contains="one"
    user "two"
    expect reply contains="two"
}
"#;
    let run = run_suite(&suite.replace("URL", &url), 1).await;
    let capped = &run.trajectories[0];
    let two = capped
        .criteria
        .iter()
        .find(|c| c.criterion.contains("\"two\""))
        .unwrap();
    assert_eq!(
        (two.status, two.turn_index),
        (CriterionStatus::Skipped, Some(1))
    );
}

#[tokio::test]
async fn a_fault_ends_only_the_trajectories_below_it() {
    let (url, _) = echo_agent().await;
    let suite = r#"
agent "echo" protocol="connexity" url="URL"
scenario "faulty" {
    user "hello"
    branch "ok" { user "yes" }
    branch "bad" { user "boom"; expect reply contains="x"; user "never sent"; expect reply contains="y" }
    criteria { no-error; reply contains="y" }
}
scenario "other" {
    user "still runs"
    expect reply contains="still runs"
}
"#;
    let run = run_suite(&suite.replace("URL", &url), 4).await;
    let by = |name: &str| {
        run.trajectories
            .iter()
            .find(|t| t.trajectory == name)
            .unwrap()
    };
    assert_eq!(by("ok").status, TrajectoryStatus::Passed);
    let bad = by("bad");
    assert_eq!(bad.status, TrajectoryStatus::Error);
    let fault = bad.fault.as_ref().unwrap();
    assert_eq!(fault.category, FaultCategory::Http5xx);
    assert_eq!(
        bad.turns, 2,
        "the faulted turn is recorded, the next one never sent"
    );
    // `no-error` is answered by the fault that ended the trajectory: failed, saying why.
    let no_error = bad.criteria.iter().find(|c| c.kind == "no-error").unwrap();
    assert_eq!(no_error.status, CriterionStatus::Failed);
    assert!(no_error.detail.as_deref().unwrap().contains("http_5xx"));
    // The check of the faulted turn names that turn; the one after it, never reached, the
    // turn it would have checked: apart from the trajectory-level check of the same text,
    // and under the key a run that reached it records it.
    let check = |text: &str| {
        let mut found = bad
            .criteria
            .iter()
            .filter(|c| c.criterion.contains(text))
            .map(|c| (c.status, c.turn_index))
            .collect::<Vec<_>>();
        found.sort_by_key(|&(_, turn)| turn);
        found
    };
    assert_eq!(check("\"x\""), [(CriterionStatus::Skipped, Some(1))]);
    assert_eq!(
        check("\"y\""),
        [
            (CriterionStatus::Skipped, None),
            (CriterionStatus::Skipped, Some(2))
        ]
    );
    let other = run
        .trajectories
        .iter()
        .find(|t| t.scenario == "other")
        .unwrap();
    assert_eq!(other.status, TrajectoryStatus::Passed);
    assert_eq!(run.summary.errors, 1);
    assert_eq!(run.summary.passed, 2);
}

/// An agent's 404 says what usually causes it: a `url` without the endpoint's path.
#[tokio::test]
async fn a_404_from_an_agent_asks_whether_its_url_has_the_path() {
    use super::support::MisbehavingServer;
    let server = MisbehavingServer::respond(404, r#"{"detail":"Not Found"}"#).await;
    let suite = format!(
        r#"
agent "web" protocol="connexity" url="{}"
scenario "s" {{
    user "hello"
    expect no-error
}}
"#,
        server.url()
    );
    let run = run_suite(&suite, 4).await;
    let fault = run.trajectories[0].fault.as_ref().unwrap();
    assert_eq!(fault.category, FaultCategory::Http4xx);
    assert!(
        fault
            .message
            .ends_with("(is the agent's `url` its whole endpoint, path included?)"),
        "{}",
        fault.message
    );
}

#[tokio::test]
async fn criteria_captures_and_templates() {
    let (url, seen) = echo_agent().await;
    let suite = r##"
agent "echo" protocol="connexity" url="URL"
scenario "checks" {
    user-context { order "42" }
    user "look up"
    expect {
        tool "lookup" order=42
        reply contains="echo"
    }
    capture "ref" regex=#"#([A-Z]-\d+)"#
    user "order {{ user_context.order }} is {{ vars.ref }}"
    expect reply equals="nope"
    criteria {
        tools-in-order "lookup"
        no-tool "refund"
        tokens max=20
        outcome "The agent looks the order up"
    }
}
"##;
    let run = run_suite(&suite.replace("URL", &url), 4).await;
    let t = &run.trajectories[0];
    assert_eq!(t.status, TrajectoryStatus::Failed);
    let status = |text: &str| {
        t.criteria
            .iter()
            .find(|c| c.criterion.contains(text))
            .unwrap_or_else(|| panic!("no criterion {text}: {:?}", t.criteria))
            .status
    };
    assert_eq!(status("lookup\" order=42"), CriterionStatus::Passed);
    assert_eq!(status("equals"), CriterionStatus::Failed);
    assert_eq!(status("tools-in-order"), CriterionStatus::Passed);
    assert_eq!(status("no-tool"), CriterionStatus::Passed);
    // 2 turns × 15 tokens = 30 > 20.
    assert_eq!(status("tokens"), CriterionStatus::Failed);
    assert_eq!(status("outcome"), CriterionStatus::Skipped);
    let last = seen.lock().unwrap().last().unwrap().clone();
    let sent = last["messages"].as_array().unwrap().last().unwrap()["content"].clone();
    assert_eq!(sent, "order 42 is A-17");
}

/// A capture is the regex's first group when it has one: an optional group that took no
/// part in the match captured nothing, and the capture fails rather than take the whole
/// match. Without a group, it is the whole match.
#[tokio::test]
async fn a_capture_whose_group_took_no_part_captured_nothing() {
    let (url, seen) = echo_agent().await;
    let suite = r##"
agent "echo" protocol="connexity" url="URL"
scenario "optional" {
    user "look up"
    capture "n" regex=#"(?:zzz(\d+))?#A-17"#
    user "n is {{ vars.n }}"
    expect no-error
}
"##;
    let run = run_suite(&suite.replace("URL", &url), 1).await;
    let optional = run
        .trajectories
        .iter()
        .find(|t| t.scenario == "optional")
        .unwrap();
    assert_eq!(optional.status, TrajectoryStatus::Failed);
    let capture = optional
        .criteria
        .iter()
        .find(|c| c.criterion.starts_with("capture"))
        .unwrap();
    assert!(
        capture
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("first group took no part")),
        "{capture:?}"
    );
    // Nothing was sent with the capture.
    let sent: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .filter_map(|r| {
            r["messages"].as_array()?.last()?["content"]
                .as_str()
                .map(String::from)
        })
        .collect();
    assert!(!sent.iter().any(|m| m.starts_with("n is")), "{sent:?}");
}

#[tokio::test]
async fn a_capture_without_a_group_is_the_whole_match() {
    let (url, seen) = echo_agent().await;
    let suite = r##"
agent "echo" protocol="connexity" url="URL"
scenario "whole" {
    user "look up"
    capture "ref" regex=#"#[A-Z]-\d+"#
    user "ref is {{ vars.ref }}"
    expect no-error
}
"##;
    let run = run_suite(&suite.replace("URL", &url), 1).await;
    assert_eq!(run.trajectories[0].status, TrajectoryStatus::Passed);
    let last = seen.lock().unwrap().last().unwrap().clone();
    let sent = last["messages"].as_array().unwrap().last().unwrap()["content"].clone();
    assert_eq!(sent, "ref is #A-17");
}

#[tokio::test]
async fn needs_skip_dependents_of_a_failed_scenario() {
    let (url, _) = echo_agent().await;
    let suite = r#"
agent "echo" protocol="connexity" url="URL"
scenario "login" {
    user "hi"
    expect reply contains="welcome"
}
scenario "checkout" {
    needs "login"
    user "buy"
}
"#;
    let run = run_suite(&suite.replace("URL", &url), 4).await;
    let checkout = run
        .trajectories
        .iter()
        .find(|t| t.scenario == "checkout")
        .unwrap();
    assert_eq!(checkout.status, TrajectoryStatus::Skipped);
    assert!(checkout.skip_reason.as_deref().unwrap().contains("login"));
}

/// Scenarios whose tasks all wait for one that comes after them: a run that started only
/// a window of scenarios at a time (three per job) would leave the needed one unstarted
/// behind the waiting ones, and hang.
#[tokio::test]
async fn needs_on_a_later_scenario_past_the_window_of_started_scenarios() {
    let (url, _) = echo_agent().await;
    let mut suite = format!("agent \"echo\" protocol=\"connexity\" url=\"{url}\"\n");
    for i in 0..6 {
        suite.push_str(&format!(
            "scenario \"waits-{i}\" {{\n    needs \"login\"\n    user \"buy\"\n    expect no-error\n}}\n"
        ));
    }
    suite.push_str("scenario \"login\" {\n    user \"hi\"\n    expect no-error\n}\n");
    let run = tokio::time::timeout(std::time::Duration::from_secs(20), run_suite(&suite, 1))
        .await
        .expect("the run ended");
    assert_eq!(run.trajectories.len(), 7);
    assert!(
        run.trajectories
            .iter()
            .all(|t| t.status == TrajectoryStatus::Passed),
        "{:#?}",
        run.trajectories
    );
}

/// An agent that answers after `delay`, remembering the most calls it ever had in flight.
async fn slow_agent(delay: std::time::Duration) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    #[derive(Clone)]
    struct Gauge {
        now: Arc<AtomicUsize>,
        max: Arc<AtomicUsize>,
        delay: std::time::Duration,
    }
    async fn respond(State(g): State<Gauge>, Json(_): Json<Value>) -> Json<Value> {
        let n = g.now.fetch_add(1, Ordering::SeqCst) + 1;
        g.max.fetch_max(n, Ordering::SeqCst);
        tokio::time::sleep(g.delay).await;
        g.now.fetch_sub(1, Ordering::SeqCst);
        Json(json!({"messages": [{"role": "assistant", "content": "ok"}]}))
    }
    let gauge = Gauge {
        now: Arc::default(),
        max: Arc::default(),
        delay,
    };
    let max = gauge.max.clone();
    let app = Router::new()
        .route("/agent/respond", post(respond))
        .with_state(gauge);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (format!("http://{addr}/agent/respond"), max)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_concurrency_and_jobs_bound_calls_in_flight() {
    let delay = std::time::Duration::from_millis(30);
    let (url, max) = slow_agent(delay).await;
    let suite = r#"
agent "slow" protocol="connexity" url="URL" { concurrency 3 }
scenario "many" {
    repeat 12
    user "a"
    branch "x" { user "x" }
    branch "y" { user "y" }
    expect no-error
}
"#;
    let run = run_suite(&suite.replace("URL", &url), 64).await;
    assert_eq!(run.summary.passed, 24);
    let seen = max.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        seen <= 3,
        "agent concurrency 3 exceeded: {seen} calls in flight"
    );
    assert!(seen >= 2, "calls should overlap: max {seen}");

    // Without an agent limit, --jobs is the bound.
    let (url, max) = slow_agent(delay).await;
    let suite = suite.replace(" { concurrency 3 }", "");
    let run = run_suite(&suite.replace("URL", &url), 2).await;
    assert_eq!(run.summary.passed, 24);
    let seen = max.load(std::sync::atomic::Ordering::SeqCst);
    assert!(seen <= 2, "--jobs 2 exceeded: {seen} calls in flight");
}

#[tokio::test]
async fn a_trajectory_timeout_ends_it_as_a_timeout_fault() {
    let (url, _) = slow_agent(std::time::Duration::from_millis(400)).await;
    let suite = r#"
agent "slow" protocol="connexity" url="URL" { timeout "10s"; retries 3 }
scenario "budget" {
    timeout "600ms"
    user "one"
    user "two"
    user "three"
}
"#;
    let run = run_suite(&suite.replace("URL", &url), 4).await;
    let t = &run.trajectories[0];
    assert_eq!(t.status, TrajectoryStatus::Error);
    let fault = t.fault.as_ref().unwrap();
    assert_eq!(fault.category, FaultCategory::Timeout);
    assert!(fault.message.contains("trajectory"), "{}", fault.message);
    assert_eq!(
        t.turns, 2,
        "the first turn finished, the second ran out of time"
    );
}

#[tokio::test]
async fn header_templates_render_from_the_environment() {
    use super::support::{MisbehavingServer, OK_BODY};
    let server = MisbehavingServer::respond(200, OK_BODY).await;
    let env = EnvSnapshot::from([(
        "TRELLIS_TEST_HEADER_TOKEN".to_string(),
        "s3cret".to_string(),
    )]);
    let suite = r#"
agent "env" protocol="connexity" url="URL" {
    header "Authorization" "Bearer {{ env.TRELLIS_TEST_HEADER_TOKEN }}"
}
agent "unset" protocol="connexity" url="URL" {
    header "Authorization" "Bearer {{ env.TRELLIS_TEST_HEADER_NEVER_SET }}"
}
scenario "hello" {
    agents "env" "unset"
    user "hi"
    expect no-error
}
"#;
    let run = run_suite_with_env(&suite.replace("URL", &server.url()), 4, env).await;
    let recorded = server.recorded();
    assert_eq!(
        recorded.len(),
        1,
        "only the agent whose header rendered is called"
    );
    assert_eq!(
        recorded[0].header("authorization").as_deref(),
        Some("Bearer s3cret")
    );
    let unset = run
        .trajectories
        .iter()
        .find(|t| t.agent == "unset")
        .unwrap();
    assert_eq!(unset.status, TrajectoryStatus::Error);
    let fault = unset.fault.as_ref().unwrap();
    assert_eq!(fault.category, FaultCategory::Setup);
    assert!(fault.message.contains("Authorization"), "{}", fault.message);
    assert!(
        fault.message.contains("`TRELLIS_TEST_HEADER_NEVER_SET`"),
        "{}",
        fault.message
    );
    let env = run.trajectories.iter().find(|t| t.agent == "env").unwrap();
    assert_eq!(env.status, TrajectoryStatus::Passed);
}

#[tokio::test]
async fn a_trajectory_timeout_does_not_count_time_queued_behind_siblings() {
    // Each trajectory takes two 150 ms turns, well inside its 500 ms budget; with one job
    // the four branches queue behind each other for far longer than that.
    let (url, _) = slow_agent(std::time::Duration::from_millis(150)).await;
    let suite = r#"
agent "slow" protocol="connexity" url="URL"
scenario "queued" {
    timeout "500ms"
    user "root"
    branch "a" { user "a" }
    branch "b" { user "b" }
    branch "c" { user "c" }
    branch "d" { user "d" }
    expect no-error
}
"#;
    let run = run_suite(&suite.replace("URL", &url), 1).await;
    assert_eq!(run.summary.passed, 4, "{:?}", run.trajectories);
    for t in &run.trajectories {
        // duration_ms is the trajectory's own time: two turns, not the queue.
        assert!(t.duration_ms < 500.0, "{}: {}", t.trajectory, t.duration_ms);
    }
}

#[tokio::test]
async fn a_scenario_skipped_for_any_reason_does_not_satisfy_needs() {
    let (url, _) = echo_agent().await;
    let suite = r#"
agent "echo" protocol="connexity" url="URL"
agent "streaming" protocol="agentscope" url="http://127.0.0.1:9/process"
scenario "unsupported" {
    agent "streaming"
    user "hi"
}
scenario "after" {
    agent "echo"
    needs "unsupported"
    user "go"
}
"#;
    let run = run_suite(&suite.replace("URL", &url), 4).await;
    let after = run
        .trajectories
        .iter()
        .find(|t| t.scenario == "after")
        .unwrap();
    assert_eq!(after.status, TrajectoryStatus::Skipped);
    assert!(
        after
            .skip_reason
            .as_deref()
            .unwrap()
            .contains("unsupported")
    );
}

#[tokio::test]
async fn first_turn_agent_calls_the_agent_with_an_empty_history() {
    let (url, seen) = echo_agent().await;
    let suite = r#"
agent "echo" protocol="connexity" url="URL"
scenario "greets" {
    first-turn "agent"
    expect reply contains="echo"
    user "hi"
    expect reply contains="echo: hi"
}
"#;
    let run = run_suite(&suite.replace("URL", &url), 4).await;
    assert_eq!(run.summary.passed, 1, "{:?}", run.trajectories);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0]["messages"], json!([]), "the agent speaks first");
    let second = seen[1]["messages"].as_array().unwrap();
    assert_eq!(second.len(), 2);
    assert_eq!(second[0]["role"], "assistant");
    assert_eq!(second[1]["content"], "hi");
    let turns = &run.nodes[0].turns;
    assert_eq!(turns[0].kind, "opening");
    assert_eq!(turns[0].user_message, "");
    assert_eq!(turns[1].kind, "user");
}

#[tokio::test]
async fn history_full_resends_the_agents_tool_calls_and_tool_messages() {
    for (mode, expected) in [("messages", 3), ("full", 5)] {
        let (url, seen) = echo_agent().await;
        let suite = format!(
            r#"
agent "echo" protocol="connexity" url="{url}" history="{mode}"
scenario "lookup" {{
    user "look up"
    expect tool "lookup" order=42
    user "thanks"
}}
"#
        );
        let run = run_suite(&suite, 4).await;
        assert_eq!(run.summary.passed, 1, "{mode}: {:?}", run.trajectories);
        let seen = seen.lock().unwrap();
        let second = seen[1]["messages"].as_array().unwrap();
        assert_eq!(second.len(), expected, "{mode}: {second:?}");
        if mode == "full" {
            assert_eq!(second[1]["tool_calls"][0]["function"]["name"], "lookup");
            assert_eq!(second[2]["role"], "tool");
            assert_eq!(second[2]["tool_call_id"], "c1");
        } else {
            assert!(second.iter().all(|m| m["role"] != "tool"));
        }
    }
}

/// A fault does not make the checks after it vanish: every `expect` the trajectory never
/// reached is recorded as skipped, with why.
#[tokio::test]
async fn checks_after_a_fault_are_recorded_as_not_run() {
    let (url, _) = echo_agent().await;
    let suite = r#"
agent "echo" protocol="connexity" url="URL"
scenario "broken" {
    user "hello"
    expect reply contains="echo"
    user "boom"
    expect reply contains="never"
    branch "a" {
        user "a"
        expect reply contains="a"
    }
    branch "b" {
        user "b"
    }
    criteria { no-tool "x" }
}
"#;
    let run = run_suite(&suite.replace("URL", &url), 4).await;
    assert_eq!(run.trajectories.len(), 2);
    for t in &run.trajectories {
        assert_eq!(t.status, TrajectoryStatus::Error);
        let skipped: Vec<&str> = t
            .criteria
            .iter()
            .filter(|c| c.status == CriterionStatus::Skipped)
            .map(|c| c.criterion.as_str())
            .collect();
        let expected: &[&str] = if t.trajectory == "a" {
            &[
                "no-tool \"x\"",
                "reply contains=\"never\"",
                "reply contains=\"a\"",
            ]
        } else {
            &["no-tool \"x\"", "reply contains=\"never\""]
        };
        let mut skipped_sorted = skipped.clone();
        skipped_sorted.sort();
        let mut expected_sorted = expected.to_vec();
        expected_sorted.sort();
        assert_eq!(skipped_sorted, expected_sorted, "{}", t.trajectory);
        assert!(t.criteria.iter().any(
            |c| c.criterion == "reply contains=\"echo\"" && c.status == CriterionStatus::Passed
        ));
    }
}
