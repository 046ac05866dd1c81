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
         scenario \"chat\" {{\n    agent \"down\"\n    user \"hi\"\n    user \"again\"\n    \
         criteria {{ no-error; turns max=5 }}\n}}\n\
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
    let chat = find("chat", "no-error");
    assert_eq!(chat.2, "failed", "{chat:?}");
    assert!(chat.3.contains("turn 0: connect fault"), "{chat:?}");
    let calls = find("calls", "no-error");
    assert_eq!(calls.2, "failed", "{calls:?}");
    assert!(calls.3.starts_with("setup fault"), "{calls:?}");
    // What the fault does not answer still did not run.
    assert_eq!(find("chat", "turns max=5").2, "skipped");
    assert!(stdout(&o).contains("1 check did not run"), "{}", stdout(&o));
}

/// An AgentScope agent never speaks first: `first-turn "agent"` against one is a suite
/// error, reported before anything runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agentscope_agent_asked_to_speak_first_is_a_suite_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("first.kdl"),
        "agent \"weather\" protocol=\"agentscope\" builtin=\"weather\"\n\
         scenario \"greets\" {\n    agent \"weather\"\n    first-turn \"agent\"\n    \
         user \"Hi\"\n    criteria { turns max=3 }\n}\n",
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
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
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
    let journal = std::fs::read_to_string(out.join("journal.jsonl")).unwrap();
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
